"""Multi30k en->de (or Tatoeba zh->en) end to end with the peer benchmark's matched config.

    python benchmarks/multi30k.py [--budget 1800 | --updates N] [--pair en-de|zh-en]
        [--workdir DIR]

Runs ``xinda prepare``, ``xinda train`` (wall-clock budget, or exactly N updates) and
``xinda translate`` (beam 5) as separate processes under ``/usr/bin/time -v`` and reports train
target tokens/s, peak RSS, BLEU/chrF (sacrebleu) on the test set and decode sentences/s. Not a
test: it takes the budget plus a few minutes. Needs ../shared/data (skips with a message when
absent).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import yaml

from xinda.device import cpu_cores, oversubscription_warning

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("XINDA_SHARED_DATA", ROOT.parent / "shared" / "data"))
# The model the serving and decoding benchmarks time (1315 updates of transformer-small on
# Multi30k en-de), and how to train it from ROOT
SERVE_MODEL = ROOT / "runs" / "serve" / "multi30k-en-de-1315"
SERVE_MODEL_HINT = (
    "xinda prepare recipes/multi30k-en-de.yaml --set data.out_dir=runs/serve/data-bin"
    " && xinda train recipes/multi30k-en-de.yaml --set data.out_dir=runs/serve/data-bin"
    " --set train.out_dir=runs/serve/multi30k-en-de-1315 --set train.max_steps=1315")

PAIRS = {
    # Multi30k: raw text straight into a joint 8k BPE, as in ../shared/bench.
    "en-de": {"corpus": "multi30k", "src": "en", "tgt": "de", "test": "test2016",
              "pretok_src": "none", "pretok_tgt": "none", "tokenize": None, "unit": "words"},
    # The fusion paper's direction on the same corpus.
    "de-en": {"corpus": "multi30k", "src": "de", "tgt": "en", "test": "test2016",
              "pretok_src": "none", "pretok_tgt": "none", "tokenize": None, "unit": "words"},
    # Tatoeba zh-en: jieba words for Chinese, joint 8k BPE; English BLEU with 13a; source
    # length in characters (Chinese has no spaces).
    "zh-en": {"corpus": "tatoeba-zh-en", "src": "zh", "tgt": "en", "test": "test",
              "pretok_src": "jieba", "pretok_tgt": "none", "tokenize": None, "unit": "chars"},
    # Classical -> modern Chinese (300k pairs, recipes/classical-modern.yaml): raw characters,
    # full-width punctuation kept; BLEU on characters (sacrebleu zh).
    "lzh-zh": {"corpus": "classical-modern", "src": "lzh", "tgt": "zh", "test": "test",
               "pretok_src": "none", "pretok_tgt": "none", "tokenize": "zh", "unit": "chars",
               "data": {"normalize": "NFC", "character_coverage": 0.9995}},
}


def experiment(pair: dict, workdir: Path, budget: float, threads: int) -> dict:
    data = SHARED / pair["corpus"]
    return {
        "data": {"src_lang": pair["src"], "tgt_lang": pair["tgt"], "train": str(data / "train"),
                 "valid": str(data / "valid"), "test": {pair["test"]: str(data / pair["test"])},
                 "out_dir": str(workdir / "data-bin"), "pretok_src": pair["pretok_src"],
                 "pretok_tgt": pair["pretok_tgt"], "subword": "bpe", "vocab_size": 8000,
                 "joint_vocab": True, **pair.get("data", {})},
        # 3+3 layers, d 256, 4 heads, FFN 1024, pre-norm, dropout 0.1 everywhere, tied.
        "model": {"preset": "transformer-small"},
        "train": {"out_dir": str(workdir / "model"), "threads": threads, "max_tokens": 4096,
                  "lr": 5e-4, "warmup_steps": 1000, "schedule": "inverse_sqrt",
                  "betas": [0.9, 0.98], "label_smoothing": 0.1, "max_seconds": budget,
                  "max_epochs": 10000, "run_validation": False, "keep_last": 1,
                  "progress": False, "log_every": 100},
        "decode": {"beam": 5, "alpha": 1.0, "batch_size": 64, "max_len_a": 1.5,
                   "max_len_b": 10},
    }


def set_threads(threads: int, jobs: int = 1) -> None:
    """Give the runs this process starts ``threads`` threads each. When ``jobs`` runs at once
    need more threads than there are cores, their OpenMP threads sleep while they wait
    (OMP_WAIT_POLICY=PASSIVE) instead of spinning on the cores the others need: 2.2x the total
    tokens/s of OpenMP's default for two 2-thread runs on 2 cores (benchmarks/cpu_sharing.py)."""
    os.environ.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    if oversubscription_warning(jobs, threads, cpu_cores()):
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def cached_result(result_path: Path, cfg: dict, label: str) -> dict | None:
    """A finished run's result.json, or None to run it: also when the finished run had another
    recipe (before, it was reported under this one)."""
    if not result_path.exists():
        return None
    result = json.loads(result_path.read_text())
    if not same_recipe(result.get("config"), cfg):
        print(f"{label}: {result_path.parent} was run with a different config: run again",
              flush=True)
        return None
    return result


def same_recipe(a: dict | None, b: dict | None) -> bool:
    """Whether two run configs are equal but for train.threads, which changes a run's speed,
    not what it trains."""
    def recipe(cfg: dict | None) -> dict | None:
        if cfg is None or "threads" not in cfg.get("train", {}):
            return cfg
        return {**cfg, "train": {k: v for k, v in cfg["train"].items() if k != "threads"}}

    return recipe(a) == recipe(b)


def write_run_config(run_dir: Path, cfg: dict) -> Path:
    """Create ``run_dir`` and write ``cfg`` to its config.yaml; returns that path."""
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = run_dir / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    return cfg_path


def code_version() -> str:
    """``git describe --always --dirty`` of this checkout; on the GPU machine, where .git does
    not travel, the one ``kit.sh pack`` recorded (``$XINDA_CODE_VERSION``), else "unknown"."""
    try:
        return subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("XINDA_CODE_VERSION", "unknown")


def markdown_table(header: list[str], rows: list[list[object]]) -> list[str]:
    """Lines of a Markdown table: the header row, its rule, one line per row."""
    def line(row: list[object]) -> str:
        return "| " + " | ".join(map(str, row)) + " |"

    return [line(header), "|" + "---|" * len(header), *map(line, rows)]


def pyplot():
    """matplotlib's pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, png: Path) -> None:
    """Lay out a matplotlib figure, write it to ``png`` (folders made) and close it."""
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, format="png", dpi=100)
    pyplot().close(fig)


@contextmanager
def curves_figure(png: Path, title: str, xlabel: str, ylabel: str,
                  size: tuple[float, float] = (7, 4)) -> Iterator:
    """The axes of a one-panel figure of curves, to draw on; then labelled, gridded, with a
    legend, written to ``png``."""
    fig, ax = pyplot().subplots(figsize=size)
    yield ax
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, png)


def add_study_arguments(ap: argparse.ArgumentParser, workdir: Path, runs: str) -> None:
    """The options every training study shares: --budget, --workdir, --threads and --set
    (``runs`` names whose recipe --set overrides, for its help text)."""
    ap.add_argument("--budget", type=float, default=300.0, help="training seconds per run")
    ap.add_argument("--workdir", type=Path, default=workdir)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    metavar="SECTION.KEY=VALUE",
                    help=f"override {runs} recipe, e.g. train.lr=7e-4 (YAML value)")


# Runs a command and writes its peak RSS (KiB, from wait4) to argv[1]: forked from this small
# process, so the figure is the command's own, not the fork of a large caller (/usr/bin/time -v
# does the same; the GPU machine may not have it).
PEAK_RSS = ("import os, subprocess, sys; child = subprocess.Popen(sys.argv[2:]); "
            "_, status, usage = os.wait4(child.pid, 0); "
            "open(sys.argv[1], 'w').write(str(usage.ru_maxrss)); "
            "sys.exit(os.waitstatus_to_exitcode(status))")


def decode_device() -> list[str]:
    """``xinda translate``'s device option: the GPU when the benchmark runs on one (its
    default is the CPU)."""
    import torch

    return ["--device", "cuda"] if torch.cuda.is_available() else []


def timed(cmd: list[str], log_path: Path, append: bool = False) -> dict:
    """Run cmd with its output in ``log_path`` (added to it with ``append``); return wall seconds
    and the command's peak RSS (MB). Safe to call from several threads at once."""
    rss_file = log_path.with_suffix(".rss")
    start = time.time()
    with log_path.open("a" if append else "w") as log:
        proc = subprocess.run([sys.executable, "-c", PEAK_RSS, str(rss_file), *cmd], check=False,
                              stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{log_path.read_text()[-2000:]}")
    return {"wall_s": time.time() - start, "peak_rss_mb": int(rss_file.read_text()) / 1024}


def score_test_set(model: Path, run_dir: Path, pair: dict, beam: int, threads: int):
    """Translate ``pair``'s test set with ``model`` into run_dir/TEST.hyp (its log:
    run_dir/translate.log) and score it against the references: sacreBLEU's BLEU."""
    from xinda.evaluate.metrics import corpus_scores
    from xinda.utils import read_lines

    test = SHARED / pair["corpus"] / pair["test"]
    hyp = run_dir / f"{pair['test']}.hyp"
    timed([sys.executable, "-m", "xinda.cli", "translate", str(model), "-i",
           f"{test}.{pair['src']}", "-o", str(hyp), "--beam", str(beam), "--threads",
           str(threads), *decode_device()], run_dir / "translate.log")
    return corpus_scores(list(read_lines(hyp)), list(read_lines(f"{test}.{pair['tgt']}")),
                         metrics=("bleu",), tokenize=pair["tokenize"])[0]


def prepare_once(cfg: dict, work: Path, label: str = "") -> None:
    """``xinda prepare`` the data of ``cfg`` into its data.out_dir unless a manifest is there
    (config and log in ``work``): one prepared with other data settings is an error (before, a
    ``--set data.vocab_size=...`` study trained on the data already there)."""
    data_bin = Path(cfg["data"]["out_dir"])
    if (data_bin / "manifest.json").exists():
        saved = json.loads((data_bin / "manifest.json").read_text()).get("config", {})
        asked = json.loads(json.dumps(cfg["data"], default=str))
        if changed := sorted(k for k, v in asked.items() if saved.get(k) != v):
            sys.exit(f"{data_bin} was prepared with other data settings ({', '.join(changed)}):"
                     " delete it, or use another --workdir")
        return
    work.mkdir(parents=True, exist_ok=True)
    cfg_path = work / "prepare.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    print(f"{label}preparing data -> {data_bin}", flush=True)
    timed([sys.executable, "-m", "xinda.cli", "prepare", str(cfg_path)], work / "prepare.log")


def run_each(run, items, parallel: bool) -> list:
    """``run(item)`` for every item, all at once with ``parallel`` (each run is a subprocess:
    the threads here only wait for them)."""
    if not parallel:
        return [run(item) for item in items]
    with ThreadPoolExecutor(len(items)) as pool:
        return list(pool.map(run, items))


def write_report(work: Path, name: str, text: str, results: list[dict], png: Path) -> None:
    """Print a study's table and write it to WORKDIR/NAME.md, its results (configs left out) to
    NAME.json."""
    print("\n" + text + "\n")
    (work / f"{name}.md").write_text(text + "\n")
    (work / f"{name}.json").write_text(json.dumps(
        [{k: v for k, v in r.items() if k != "config"} for r in results], indent=1))
    print(f"wrote {work / name}.md, {work / name}.json and {png}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=float, default=1800.0, help="training seconds")
    ap.add_argument("--updates", type=int, default=0,
                    help="train exactly this many updates instead of --budget seconds: BLEU "
                         "after N updates does not depend on the machine's speed or load")
    ap.add_argument("--pair", choices=sorted(PAIRS), default="en-de")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1, help="training seed (model initialisation, "
                    "batch order, dropout); the data and its subword model stay the same")
    args = ap.parse_args()
    pair = PAIRS[args.pair]
    if not (SHARED / pair["corpus"]).is_dir():
        print(f"skipped: {SHARED / pair['corpus']} not found (set XINDA_SHARED_DATA)")
        return
    work = (args.workdir or ROOT / "runs" / f"bench-{args.pair}").resolve()
    work.mkdir(parents=True, exist_ok=True)
    cfg_path = work / "config.yaml"
    cfg = experiment(pair, work, 0 if args.updates else args.budget, args.threads)
    cfg["train"]["max_steps"] = args.updates
    cfg["train"]["seed"] = args.seed
    cfg_path.write_text(yaml.safe_dump(cfg))
    set_threads(args.threads)
    xinda = [sys.executable, "-m", "xinda.cli"]

    timed([*xinda, "prepare", str(cfg_path)], work / "prepare.log")
    if (work / "model").exists():
        import shutil

        shutil.rmtree(work / "model")
    train = timed([*xinda, "train", str(cfg_path)], work / "train.log")
    stats = json.loads((work / "model" / "train_stats.json").read_text())

    test = SHARED / pair["corpus"] / pair["test"]
    hyp = work / f"{pair['test']}.hyp"
    dec = timed([*xinda, "translate", str(work / "model"), "-i", f"{test}.{pair['src']}",
                 "-o", str(hyp), "--beam", "5", "--threads", str(args.threads),
                 *decode_device()],
                work / "translate.log")
    speed = re.search(r"\(([\d.]+) sentences/s\)", (work / "translate.log").read_text())

    import sacrebleu

    hyps = hyp.read_text(encoding="utf-8").splitlines()
    refs = Path(f"{test}.{pair['tgt']}").read_text(encoding="utf-8").splitlines()
    bleu = sacrebleu.metrics.BLEU(**({"tokenize": pair["tokenize"]} if pair["tokenize"] else {}))
    chrf = sacrebleu.metrics.CHRF()
    result = {
        "pair": args.pair, "seed": args.seed, "budget_s": None if args.updates else args.budget,
        "updates": stats["steps"], "train_seconds": round(stats["train_seconds"], 1),
        "train_tgt_tok_per_s": round(stats["tgt_tok_per_s"], 1),
        "train_peak_rss_mb": round(train["peak_rss_mb"]), "precision": stats["precision"],
        "bleu": round(bleu.corpus_score(hyps, [refs]).score, 2),
        "chrf": round(chrf.corpus_score(hyps, [refs]).score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "decode_sents_per_s": float(speed.group(1)) if speed else None,
        "decode_process_wall_s": round(dec["wall_s"], 2),
        "decode_peak_rss_mb": round(dec["peak_rss_mb"]),
    }
    (work / "result.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
