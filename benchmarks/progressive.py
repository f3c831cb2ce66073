"""Progressive (shallow-to-deep) training against training the deep model from scratch, at equal
training time (issue 14; textbook ch. 15, Li et al. 2020).

    python benchmarks/progressive.py [--layers 12] [--budget 1200] [--shallow-share 0.5]
        [--lr 5e-4] [--warmup 1000] [--pair en-de] [--beam 5] [--workdir runs/progressive]
        [--data-bin DIR] [--threads 2] [--parallel] [--png docs/results/progressive.png]
        [--set section.key=value ...]

Both arms end with the same model: transformer-small (d_model 256, pre-norm, dropout 0.1) with a
``--layers``-layer encoder and a 3-layer decoder, trained on Multi30k with the recipe of
``multi30k.py`` (Adam 0.9/0.98, 4096 tokens per batch, label smoothing 0.1, inverse_sqrt to the
peak ``--lr`` after ``--warmup`` updates), the same seed, validated (loss) at every epoch end:

* scratch     -- the ``--layers``-layer encoder from random weights for ``--budget`` seconds;
* progressive -- a ``--layers``/2-layer encoder for ``--shallow-share`` x budget seconds, then
  ``xinda grow --to LAYERS`` (the trained encoder stacked on itself) and ``xinda train --resume``
  with a fresh optimizer and the learning rate restarted at its peak for the rest.

A budget is wall-clock seconds of ``xinda train`` (``train.max_seconds``, per call; epoch-end
validation included), so both arms get the same compute. ``--parallel`` runs the two arms at
once with half the threads each (one core each on a 2-core CPU). Reported per arm: updates,
final and best validation loss, the training seconds at which it first reaches the scratch
arm's best validation loss (time to a common quality), and test BLEU of the best checkpoint by
validation loss. Validation loss against training seconds goes into ``--png``; the table and
raw numbers into WORKDIR/progressive.{md,json}. Runs whose result.json exists are reused.
Needs ../shared/data/multi30k.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import multi30k as bench

from xinda.config import apply_overrides
from xinda.train.curves import read_log

ARMS = ("scratch", "progressive")
XINDA = [sys.executable, "-m", "xinda.cli"]


def arm_config(run_dir: Path, data_bin: Path, layers: int, seconds: float, args) -> dict:
    """The recipe of a ``layers``-layer encoder trained for ``seconds`` into run_dir/model."""
    cfg = bench.experiment(bench.PAIRS[args.pair], run_dir, seconds, args.run_threads)
    cfg["data"]["out_dir"] = str(data_bin)
    cfg["model"] = {"preset": "transformer-small", "encoder_layers": layers, "decoder_layers": 3}
    cfg["train"].update(lr=args.lr, warmup_steps=args.warmup, seed=args.seed, keep_last=1,
                        run_validation=True, valid_bleu=False, log_every=50)
    apply_overrides(cfg, args.overrides)
    return cfg


def plan(run_dir: Path, data_bin: Path, arm: str, args) -> dict:
    """What an arm runs: its first ``xinda train`` config and, for progressive, the growth."""
    if arm == "scratch":
        return {"train": arm_config(run_dir, data_bin, args.layers, args.budget, args)}
    shallow_s = round(args.budget * args.shallow_share, 1)
    return {"train": arm_config(run_dir, data_bin, args.layers // 2, shallow_s, args),
            "grow_to": args.layers, "deep_seconds": round(args.budget - shallow_s, 1)}


def deep_phase(deep: Path, args) -> list[str]:
    """The command that trains the grown model on. ``train.max_seconds`` counts the whole run
    (the grown model keeps the shallow phase's clock), so it is the total budget: the deep
    phase gets what the shallow one left (before, the deep share alone: no update at all)."""
    return [*XINDA, "train", str(deep / "config.yaml"), "--resume", "--set",
            f"train.max_seconds={args.budget}"]


def valid_curve(model_dir: Path) -> list[list[float]]:
    """[training seconds, update, validation loss] at every epoch end."""
    rows = read_log(model_dir / "log.csv")
    return [[r["elapsed_s"], int(r["step"]), r["valid_loss"]] for r in rows if "valid_loss" in r]


def run_arm(work: Path, data_bin: Path, arm: str, args) -> dict:
    """Train one arm, translate the test set with its best checkpoint, score; cached."""
    run_dir = work / arm
    result_path = run_dir / "result.json"
    todo = plan(run_dir, data_bin, arm, args)
    if (result := bench.cached_result(result_path, todo, f"{arm}:")) is not None:
        print(f"{arm}: cached", flush=True)
        return result
    cfg_path = bench.write_run_config(run_dir, todo["train"])
    model = run_dir / "model"
    deep = run_dir / f"model-{args.layers}l"
    for old in (model, deep):
        shutil.rmtree(old, ignore_errors=True)
    layers = todo["train"]["model"]["encoder_layers"]
    print(f"{arm}: training {layers}+3 layers for {todo['train']['train']['max_seconds']:g} s",
          flush=True)
    bench.timed([*XINDA, "train", str(cfg_path)], run_dir / "train.log")
    grown_at = None
    if arm == "progressive":
        grown_at = json.loads((model / "train_stats.json").read_text())["steps"]
        bench.timed([*XINDA, "grow", str(model), "--to", str(args.layers), "--output", str(deep)],
                    run_dir / "grow.log")
        print(f"{arm}: grown to {args.layers}+3 layers, training {todo['deep_seconds']:g} s more",
              flush=True)
        bench.timed(deep_phase(deep, args), run_dir / "train.log", append=True)
        model = deep

    bleu = bench.score_test_set(model, run_dir, bench.PAIRS[args.pair], args.beam,
                                args.run_threads)
    stats = json.loads((model / "train_stats.json").read_text())
    curve = valid_curve(model)
    result = {
        "arm": arm, "encoder_layers": args.layers, "params": stats["parameters"],
        "updates": stats["steps"], "train_seconds": round(stats["train_seconds"], 1),
        "grown_at_update": grown_at,
        "final_valid_loss": curve[-1][2], "best_valid_loss": min(c[2] for c in curve),
        "bleu": round(bleu.score, 2), "bleu_signature": bleu.signature, "beam": args.beam,
        "valid_curve": curve, "config": todo,
    }
    result_path.write_text(json.dumps(result, indent=1))
    print(f"{arm}: {result['updates']} updates, best valid loss {result['best_valid_loss']:.3f}, "
          f"BLEU {result['bleu']}", flush=True)
    return result


def seconds_to(curve: list[list[float]], target: float) -> float | None:
    """Training seconds at the first validation with loss <= ``target`` (None: never)."""
    return next((seconds for seconds, _, loss in curve if loss <= target), None)


def plot(results: list[dict], png: Path, title: str) -> None:
    with bench.curves_figure(png, title, "training seconds",
                             "validation loss per token (label-smoothed)") as ax:
        for r in results:
            seconds, _, losses = zip(*r["valid_curve"])
            ax.plot(seconds, losses, "o-", ms=3, label=f"{r['arm']} (BLEU {r['bleu']:.2f})")
            if r["grown_at_update"] is not None:
                at = next(s for s, u, _ in r["valid_curve"] if u >= r["grown_at_update"])
                ax.axvline(at, color="grey", ls=":", lw=1, label=f"grown at update "
                                                              f"{r['grown_at_update']}")


def table(results: list[dict], args) -> str:
    cfg = results[0]["config"]["train"]
    width = cfg["model"].get("d_model", 256)
    target = results[0]["best_valid_loss"]  # the scratch arm's
    together = f" (both arms at once, {args.run_threads} thread(s) each)" if args.parallel else ""
    lines = [
        (f"### Progressive {args.layers // 2} -> {args.layers} layers vs {args.layers} layers "
         f"from scratch: {args.layers}+3 x {width}, {args.budget:g} s each{together}, "
         f"Multi30k {args.pair}"),
        "",
        (f"lr {args.lr:g} (inverse_sqrt, warmup {args.warmup}; restarted at its peak after the "
         f"growth), {cfg['train']['max_tokens']} tokens per batch, seed {args.seed}; the shallow "
         f"phase takes {args.shallow_share:g} of the budget. \"to scratch's best\": training "
         f"seconds until the validation loss first reaches the scratch arm's best, "
         f"{target:.3f}. BLEU: sacreBLEU on the test set, best checkpoint by validation loss, "
         f"beam {args.beam}."),
        "",
    ]
    header = ["arm", "params", "updates", "grown at", "final valid loss", "best valid loss",
              "to scratch's best (s)", "BLEU"]
    body = []
    for r in results:
        reach = seconds_to(r["valid_curve"], target)
        body.append([r["arm"], f"{r['params']:,}", r["updates"], r["grown_at_update"] or "-",
                     f"{r['final_valid_loss']:.3f}", f"{r['best_valid_loss']:.3f}",
                     "not reached" if reach is None else f"{reach:.0f}", f"{r['bleu']:.2f}"])
    lines += bench.markdown_table(header, body)
    grown = results[-1]["grown_at_update"]
    if grown is not None and grown < args.warmup:
        lines += ["", (f"The growth came at update {grown}, inside the warm-up "
                       f"({args.warmup}): the restart at the peak learning rate skipped the rest "
                       "of the warm-up.")]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bench.add_study_arguments(ap, bench.ROOT / "runs" / "progressive", "both arms'")
    ap.set_defaults(budget=1200.0)
    ap.add_argument("--layers", type=int, default=12, help="encoder layers in the end (even)")
    ap.add_argument("--shallow-share", type=float, default=0.5,
                    help="share of the budget spent on the half-depth encoder")
    ap.add_argument("--lr", type=float, default=5e-4, help="peak learning rate")
    ap.add_argument("--warmup", type=int, default=1000, help="warm-up updates")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pair", choices=("en-de", "de-en"), default="en-de")
    ap.add_argument("--beam", type=int, default=5, help="test decoding beam (1 = greedy)")
    ap.add_argument("--png", type=Path,
                    default=bench.ROOT / "docs" / "results" / "progressive.png")
    ap.add_argument("--data-bin", type=Path, default=None,
                    help="prepared Multi30k data of the same recipe and pair to reuse (default: "
                         "WORKDIR/data-bin, prepared if missing)")
    ap.add_argument("--parallel", action="store_true", help="run both arms at once, threads/2 "
                                                            "each")
    args = ap.parse_args()
    if args.layers < 2 or args.layers % 2:
        ap.error("--layers must be even and at least 2")
    if not 0 < args.shallow_share < 1:
        ap.error("--shallow-share must lie strictly between 0 and 1")
    args.run_threads = max(1, args.threads // 2) if args.parallel else args.threads
    corpus = bench.SHARED / bench.PAIRS[args.pair]["corpus"]
    if not corpus.is_dir():
        print(f"skipped: {corpus} not found (set XINDA_SHARED_DATA)")
        return
    work = args.workdir.resolve()
    data_bin = (args.data_bin or work / "data-bin").resolve()
    bench.set_threads(args.run_threads, 2 if args.parallel else 1)
    bench.prepare_once(arm_config(work, data_bin, args.layers, 0, args), work)
    results = bench.run_each(lambda arm: run_arm(work, data_bin, arm, args), ARMS,
                             args.parallel)
    text = table(results, args)
    plot(results, args.png.resolve(), f"{args.layers}-layer encoder: progressive vs scratch, "
                                      f"{args.budget:g} s each")
    bench.write_report(work, "progressive", text, results, args.png)


if __name__ == "__main__":
    main()
