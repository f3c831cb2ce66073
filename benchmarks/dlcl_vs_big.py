"""DLCL-30 against Transformer-Big at equal training time (issue 14; textbook ch. 15: a
30-layer pre-norm DLCL encoder, 137M parameters, matches Transformer-Big, 210M, and trains
2.1x faster).

    python benchmarks/dlcl_vs_big.py [--budget 600] [--pair lzh-zh] [--valid-every 500]
        [--max-tokens 8192] [--lr 7e-4] [--warmup 4000] [--beam 5] [--workdir runs/dlcl-vs-big]
        [--data-bin DIR] [--threads 2] [--parallel] [--png docs/results/dlcl-vs-big.png]
        [--set section.key=value ...]

Two arms, ``transformer-dlcl`` (pre-norm 30+6 layers x 512, DLCL on both stacks) and
``transformer-big`` (post-norm 6+6 x 1024), train on the same prepared data (by default
classical -> modern Chinese, the largest corpus here, with the recipe of ``multi30k.py``'s
``lzh-zh``) with the same schedule (Adam 0.9/0.98, inverse_sqrt to ``--lr`` after ``--warmup``
updates, ``--max-tokens`` per batch, label smoothing 0.1, the same seed) for ``--budget``
seconds of ``xinda train`` each (``train.max_seconds``). They validate every
``--valid-every`` updates and at epoch ends (``train.valid_every``: an epoch of 300k pairs is
long), by loss and greedy BLEU. Reported per arm: parameters, updates, target tokens/s, best
validation BLEU, the training seconds at which it first reaches the lower of the two arms'
best validation BLEU (time to a common BLEU) and test BLEU (beam ``--beam``) of its best
checkpoint; validation BLEU against training seconds goes into ``--png``, the table and raw
numbers into WORKDIR/dlcl-vs-big.{md,json}. ``--parallel`` trains both at once (on one GPU
they share it: the same wall clock, not the same GPU time). Meant for a GPU; runs whose
result.json exists are reused. Needs ../shared/data/classical-modern (or the --pair's corpus).
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

ARMS = {"dlcl": {"preset": "transformer-dlcl"}, "big": {"preset": "transformer-big"}}
XINDA = [sys.executable, "-m", "xinda.cli"]


def arm_config(run_dir: Path, data_bin: Path, arm: str, args) -> dict:
    """The shared recipe with ``arm``'s model, trained for ``--budget`` s into run_dir/model."""
    cfg = bench.experiment(bench.PAIRS[args.pair], run_dir, args.budget, args.run_threads)
    cfg["data"]["out_dir"] = str(data_bin)
    cfg["model"] = dict(ARMS[arm])
    cfg["train"].update(lr=args.lr, warmup_steps=args.warmup, max_tokens=args.max_tokens,
                        seed=args.seed, keep_last=1, run_validation=True, valid_bleu=True,
                        valid_every=args.valid_every, log_every=50)
    apply_overrides(cfg, args.overrides)
    return cfg


def bleu_curve(model_dir: Path) -> list[list[float]]:
    """[training seconds, update, validation BLEU] at every validation."""
    rows = read_log(model_dir / "log.csv")
    return [[r["elapsed_s"], int(r["step"]), r["valid_bleu"]] for r in rows
            if "valid_bleu" in r]


def seconds_to(curve: list[list[float]], target: float) -> float | None:
    """Training seconds at the first validation with BLEU >= ``target`` (None: never)."""
    return next((seconds for seconds, _, bleu in curve if bleu >= target), None)


def run_arm(work: Path, data_bin: Path, arm: str, args) -> dict:
    """Train one arm, translate the test set with its best checkpoint, score; cached."""
    run_dir = work / arm
    result_path = run_dir / "result.json"
    cfg = arm_config(run_dir, data_bin, arm, args)
    if (result := bench.cached_result(result_path, cfg, f"{arm}:")) is not None:
        print(f"{arm}: cached", flush=True)
        return result
    cfg_path = bench.write_run_config(run_dir, cfg)
    model = run_dir / "model"
    shutil.rmtree(model, ignore_errors=True)
    print(f"{arm}: training {cfg['model']['preset']} for {args.budget:g} s", flush=True)
    bench.timed([*XINDA, "train", str(cfg_path)], run_dir / "train.log")
    bleu = bench.score_test_set(model, run_dir, bench.PAIRS[args.pair], args.beam,
                                args.run_threads)
    stats = json.loads((model / "train_stats.json").read_text())
    curve = bleu_curve(model)
    result = {"arm": arm, "preset": cfg["model"]["preset"], "params": stats["parameters"],
              "updates": stats["steps"], "train_seconds": round(stats["train_seconds"], 1),
              "tgt_tok_per_s": round(stats["tgt_tok_per_s"]), "device": stats.get("device"),
              "precision": stats.get("precision"), "best_valid_bleu": max(c[2] for c in curve),
              "bleu": round(bleu.score, 2), "bleu_signature": bleu.signature,
              "beam": args.beam, "valid_bleu_curve": curve, "code": bench.code_version(),
              "config": cfg}
    result_path.write_text(json.dumps(result, indent=1))
    print(f"{arm}: {result['updates']} updates, best valid BLEU {result['best_valid_bleu']:.2f}, "
          f"test BLEU {result['bleu']}", flush=True)
    return result


def plot(results: list[dict], png: Path, title: str) -> None:
    with bench.curves_figure(png, title, "training seconds", "validation BLEU (greedy)") as ax:
        for r in results:
            seconds, _, bleu = zip(*r["valid_bleu_curve"])
            ax.plot(seconds, bleu, "o-", ms=3, label=f"{r['preset']} ({r['params'] / 1e6:.0f}M, "
                                                     f"test BLEU {r['bleu']:.2f})")


def table(results: list[dict], args) -> str:
    target = min(r["best_valid_bleu"] for r in results)
    together = " (both at once)" if args.parallel else ""
    lines = [
        f"### DLCL-30 vs Transformer-Big, {args.budget:g} s each{together}, {args.pair}",
        "",
        (f"lr {args.lr:g} (inverse_sqrt, warmup {args.warmup}), {args.max_tokens} tokens per "
         f"batch, seed {args.seed}, validation every {args.valid_every} updates and at epoch "
         f"ends. \"to the common BLEU\": training seconds until validation BLEU first reaches "
         f"{target:.2f}, the lower of the two arms' best. Test BLEU: sacreBLEU, best checkpoint, "
         f"beam {args.beam}."),
        "",
    ]
    header = ["arm", "params", "updates", "tgt tok/s", "best valid BLEU",
              "to the common BLEU (s)", "test BLEU"]
    body = [[r["preset"], f"{r['params']:,}", r["updates"], r["tgt_tok_per_s"],
             f"{r['best_valid_bleu']:.2f}",
             f"{s:.0f}" if (s := seconds_to(r["valid_bleu_curve"], target)) is not None
             else "not reached", f"{r['bleu']:.2f}"] for r in results]
    return "\n".join(lines + bench.markdown_table(header, body))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bench.add_study_arguments(ap, bench.ROOT / "runs" / "dlcl-vs-big", "both arms'")
    ap.set_defaults(budget=600.0)
    ap.add_argument("--pair", choices=sorted(bench.PAIRS), default="lzh-zh")
    ap.add_argument("--valid-every", type=int, default=500, help="updates between validations")
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--lr", type=float, default=7e-4, help="peak learning rate")
    ap.add_argument("--warmup", type=int, default=4000, help="warm-up updates")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--beam", type=int, default=5, help="test decoding beam (1 = greedy)")
    ap.add_argument("--png", type=Path,
                    default=bench.ROOT / "docs" / "results" / "dlcl-vs-big.png")
    ap.add_argument("--data-bin", type=Path, default=None,
                    help="prepared data of the same recipe and pair to reuse (default: "
                         "WORKDIR/data-bin, prepared if missing)")
    ap.add_argument("--parallel", action="store_true", help="train both arms at once")
    args = ap.parse_args()
    if args.valid_every < 1:
        ap.error("--valid-every must be at least 1")
    args.run_threads = max(1, args.threads // 2) if args.parallel else args.threads
    corpus = bench.SHARED / bench.PAIRS[args.pair]["corpus"]
    if not corpus.is_dir():
        print(f"skipped: {corpus} not found (set XINDA_SHARED_DATA)")
        return
    work = args.workdir.resolve()
    data_bin = (args.data_bin or work / "data-bin").resolve()
    bench.set_threads(args.run_threads, 2 if args.parallel else 1)
    bench.prepare_once(arm_config(work, data_bin, "big", args), work)
    results = bench.run_each(lambda arm: run_arm(work, data_bin, arm, args), ARMS,
                             args.parallel)
    plot(results, args.png.resolve(), f"DLCL-30 vs Transformer-Big, {args.budget:g} s each")
    bench.write_report(work, "dlcl-vs-big", table(results, args), results, args.png)


if __name__ == "__main__":
    main()
