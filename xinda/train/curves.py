"""Training log (CSV, one row per logged update or validation) and its PNG plot."""

from __future__ import annotations

import csv
from pathlib import Path

from xinda.errors import XindaError
from xinda.train.progress import Progress
from xinda.utils import atomic_save

FIELDS = ["step", "epoch", "lr", "train_loss", "train_nll", "tok_per_s", "elapsed_s",
          "valid_loss", "valid_ppl", "valid_bleu"]


class CsvLog:
    def __init__(self, path: Path):
        self.path = path
        if not path.exists():
            with path.open("w", newline="") as f:
                csv.writer(f).writerow(FIELDS)

    def truncate_after(self, step: int, train_at_step: bool = True,
                       valid_at_step: bool = True) -> None:
        """Drop rows logged after ``step`` (they are replayed when training resumes there), the
        train or validation row at ``step`` when the checkpoint there holds it as not logged
        (``train_at_step``/``valid_at_step`` False), and a last row torn by a crash while it was
        appended (no final newline, or not all fields)."""
        def keep(row: list[str]) -> bool:
            if len(row) != len(FIELDS) or not row[0].isdigit() or int(row[0]) > step:
                return False
            validation = row[FIELDS.index("valid_loss")] != ""
            return int(row[0]) < step or (valid_at_step if validation else train_at_step)

        kept = [FIELDS, *filter(keep, read_rows(self.path))]

        def write(tmp: Path) -> None:
            with tmp.open("w", newline="") as f:
                csv.writer(f).writerows(kept)

        atomic_save(self.path, write)

    def write_window(self, p: Progress, lr: float) -> None:
        """The train row of the updates in ``p.log_window``: per-token loss and NLL, tokens/s;
        its epoch the last update's (at an epoch's start, with no batch done, the one before)."""
        loss, nll, ntok, seconds = p.log_window
        self.write(step=p.step, epoch=p.epoch - (p.batch == 0), lr=lr, train_loss=loss / ntok,
                   train_nll=nll / ntok, tok_per_s=ntok / seconds, elapsed_s=p.train_seconds)

    def write(self, **row) -> None:
        with self.path.open("a", newline="") as f:
            csv.writer(f).writerow([_fmt(row.get(k)) for k in FIELDS])


def read_rows(path: Path) -> list[list[str]]:
    """The rows of the training log ``path`` after its header, less a last row torn by a crash
    (no final newline). A XindaError names a line that is not UTF-8 text, or a row of the
    log's fields with one that is not a number (a damaged log: the run would fail later)."""
    data = path.read_bytes()
    try:
        lines = data.decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise _damaged(path, line, f"not UTF-8 text (invalid byte at offset {err.start})"
                       ) from None
    if lines and not lines[-1].endswith("\n"):
        lines.pop()  # torn: the process died while writing it
    try:
        rows = list(csv.reader(lines))[1:]
    except csv.Error as err:
        raise _damaged(path, None, f"not CSV ({err})") from None
    for line, row in enumerate(rows, 2):
        bad = [(k, v) for k, v in zip(FIELDS, row) if v and not _is_number(v)]
        if len(row) == len(FIELDS) and bad:
            raise _damaged(path, line, f"{bad[0][0]} {bad[0][1]!r} is not a number")
    return rows


def _damaged(path: Path, line: int | None, problem: str) -> XindaError:
    where = f"{path}: line {line}" if line else str(path)
    return XindaError(f"{where}: {problem}: a damaged training log; repair it, or move it "
                      "aside (training then starts a new one)")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _fmt(value) -> str:
    if value is None:
        return ""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def read_log(path: Path) -> list[dict[str, float]]:
    with path.open(newline="") as f:
        return [{k: float(v) for k, v in row.items() if v not in ("", None)}
                for row in csv.DictReader(f)]


def plot_curves(log_path: Path, png_path: Path, title: str = "") -> None:
    """Train loss (per token) and validation loss/BLEU against updates."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_log(log_path)
    train = [(r["step"], r["train_loss"]) for r in rows if "train_loss" in r]
    valid = [(r["step"], r["valid_loss"]) for r in rows if "valid_loss" in r]
    bleu = [(r["step"], r["valid_bleu"]) for r in rows if "valid_bleu" in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot(*zip(*train), label="train loss", lw=1)
    if valid:
        ax.plot(*zip(*valid), "o-", label="valid loss")
    ax.set_xlabel("update")
    ax.set_ylabel("loss per token")
    ax.set_title(title)
    if bleu:
        ax2 = ax.twinx()
        ax2.plot(*zip(*bleu), "s--", color="tab:green", label="valid BLEU")
        ax2.set_ylabel("BLEU")
        ax2.set_ylim(0, max(1.0, 1.05 * max(b for _, b in bleu)))  # (all 0: not -0.05..0.05)
        ax2.legend(loc="upper center")
    if train or valid:
        ax.legend(loc="upper right")
    fig.tight_layout()
    atomic_save(png_path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    plt.close(fig)
