"""Deep-encoder stability: the same deep Transformer trained post-norm and pre-norm, one plot.

    python benchmarks/deep_stability.py [--layers 24] [--budget 300] [--lr 5e-4] [--warmup 1000]
        [--beam 5] [--png docs/results/deep-stability.png] [--workdir runs/deep-stability]
        [--data-bin DIR] [--threads 2] [--parallel] [--set section.key=value ...]

Model: transformer-small's width (d_model 256, 4 heads, FFN 1024, dropout 0.1) with a
``--layers``-layer encoder and a 3-layer decoder, once with ``norm: post`` and once with
``norm: pre``. Both runs use the transformer-small recipe of ``multi30k.py`` (Adam
0.9/0.98, 4096 tokens per batch, label smoothing 0.1) with the same inverse_sqrt schedule
(peak lr ``--lr`` after ``--warmup`` updates, constant lr when ``--warmup 0``; textbook
ch. 15 expects a deep post-norm stack to fail where pre-norm trains, docs/benchmarks.md has what
we measured), the same seed, the same wall-clock budget and the
same Multi30k en->de data, prepared once (WORKDIR/data-bin, or an already prepared ``--data-bin``
of the same recipe, e.g. runs/ablation/en-de/data-bin). The training log (log.csv, one row
every 20 updates) of each run is plotted into one PNG: train loss against updates and against
training seconds. Then test2016 is decoded (beam ``--beam``; 1 = greedy) and a table is printed
and written to WORKDIR/deep-stability.md (raw numbers in WORKDIR/deep-stability.json):
norm, updates, first / final / min logged train loss, BLEU, and a verdict.

Verdict rule: "trains" if the final logged train loss is below the *unigram floor*, the
label-smoothed loss of the best context-free model (one that predicts every target token from
the training data's token frequencies, end-of-sentence included); "stalls" if it is finite but
not below it (the model has learnt no more than word frequencies); "diverges" if it is not
finite. The floor is drawn into the plot.

``--parallel`` trains and decodes both runs at the same time with half the threads each (one
core each on a 2-core CPU): both still get the same compute, and the benchmark takes half the
wall time.

Not a test: it takes about 2 x (budget + decoding, 1-3 min) plus a minute of data preparation,
i.e. ~15 min with the defaults on a 2-core CPU (half with ``--parallel``). Runs whose
result.json exists are reused. Needs ../shared/data/multi30k.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import multi30k as bench

from xinda.config import apply_overrides
from xinda.train.curves import read_log

PAIR = bench.PAIRS["en-de"]
NORMS = ("post", "pre")


def stability_config(run_dir: Path, data_bin: Path, norm: str, args) -> dict:
    cfg = bench.experiment(PAIR, run_dir, args.budget, args.run_threads)
    cfg["data"]["out_dir"] = str(data_bin)
    cfg["model"] = {"preset": "transformer-small", "encoder_layers": args.layers,
                    "decoder_layers": 3, "norm": norm}
    cfg["train"].update(lr=args.lr, warmup_steps=args.warmup,
                        schedule="inverse_sqrt" if args.warmup else "constant",
                        log_every=args.log_every, seed=args.seed)
    apply_overrides(cfg, args.overrides)
    return cfg


def unigram_floor(data_bin: Path, epsilon: float) -> float:
    """Label-smoothed loss per token (nats) of the best context-free predictor of the targets.

    For a predictor q that ignores the context, the expected smoothed loss is the cross-entropy
    of t = (1 - eps) * p + eps / V with q (p: token frequencies); it is least, H(t), at q = t.
    """
    ids = np.load(data_bin / "train.tgt.ids.npy")
    sentences = len(np.load(data_bin / "train.tgt.offsets.npy")) - 1
    counts = np.bincount(ids).astype(np.float64)
    counts = np.append(counts, sentences)  # one end-of-sentence per target sentence
    vocab = len(counts)
    target = (1 - epsilon) * counts / counts.sum() + epsilon / vocab
    return float(-(target * np.log(target)).sum())


def verdict(final: float, floor: float) -> str:
    if not math.isfinite(final):
        return "diverges"
    return "trains" if final < floor else "stalls"


def run_norm(work: Path, data_bin: Path, norm: str, args) -> dict:
    run_dir = work / f"{norm}-norm"
    result_path = run_dir / "result.json"
    cfg = stability_config(run_dir, data_bin, norm, args)
    if (result := bench.cached_result(result_path, cfg, f"{norm}-norm:")) is not None:
        print(f"{norm}-norm: cached", flush=True)
        return result
    cfg_path = bench.write_run_config(run_dir, cfg)
    xinda = [sys.executable, "-m", "xinda.cli"]
    shutil.rmtree(run_dir / "model", ignore_errors=True)
    print(f"{norm}-norm: training {args.layers}+3 layers for {args.budget:g} s", flush=True)
    bench.timed([*xinda, "train", str(cfg_path)], run_dir / "train.log")
    stats = json.loads((run_dir / "model" / "train_stats.json").read_text())
    rows = [r for r in read_log(run_dir / "model" / "log.csv") if "train_loss" in r]

    bleu = bench.score_test_set(run_dir / "model", run_dir, PAIR, args.beam, args.run_threads)

    losses = [r["train_loss"] for r in rows]
    finite = [x for x in losses if math.isfinite(x)]
    result = {
        "norm": norm, "encoder_layers": args.layers, "decoder_layers": 3,
        "params": stats["parameters"], "updates": stats["steps"],
        "train_seconds": stats["train_seconds"], "tok_per_s": round(stats["tgt_tok_per_s"], 1),
        "first_loss": losses[0] if losses else float("nan"),
        "final_loss": losses[-1] if losses else float("nan"),
        "min_loss": min(finite) if finite else float("nan"),
        "bleu": round(bleu.score, 2), "bleu_signature": bleu.signature, "beam": args.beam,
        # step, elapsed seconds, lr, train loss of every logged row, for the plot
        "curve": [[r["step"], r.get("elapsed_s", float("nan")), r.get("lr", float("nan")),
                   r["train_loss"]] for r in rows],
        "config": cfg,
    }
    result_path.write_text(json.dumps(result, indent=1))
    print(f"{norm}-norm: {result['updates']} updates, final loss {result['final_loss']:.3f}, "
          f"BLEU {result['bleu']}", flush=True)
    return result


def plot(results: list[dict], png: Path, title: str, floor: float) -> None:
    fig, (by_step, by_time) = bench.pyplot().subplots(1, 2, figsize=(11, 4), sharey=True)
    for r in results:
        curve = r["curve"]
        if not curve:
            continue
        steps, seconds, _, losses = zip(*curve)
        label = f"{r['norm']}-norm ({r['verdict']})"
        by_step.plot(steps, losses, label=label, lw=1.2)
        by_time.plot(seconds, losses, label=label, lw=1.2)
    by_step.set_xlabel("update")
    by_time.set_xlabel("training seconds")
    by_step.set_ylabel("train loss per token (label-smoothed)")
    for ax in (by_step, by_time):
        ax.axhline(floor, color="grey", ls="--", lw=1, label=f"unigram floor {floor:.2f}")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    bench.save_figure(fig, png)


def _fmt(x: float) -> str:
    return f"{x:.3f}" if math.isfinite(x) else str(x)


def schedule(args) -> str:
    if args.warmup == 0:
        return "constant, no warm-up"
    return f"inverse_sqrt, warmup {args.warmup}"


def table(results: list[dict], args, floor: float) -> str:
    decode = "greedy" if args.beam == 1 else f"beam {args.beam}"
    threads = f"{args.run_threads} thread{'s' if args.run_threads > 1 else ''}"
    together = f" (both at once, {threads} each)" if args.parallel else ""
    cfg = results[0]["config"]  # the recipe both runs share, overrides applied
    first_row = "update 1" if args.log_every == 1 else f"mean of updates 1-{args.log_every}"
    lines = [
        (f"### Deep encoder stability: {args.layers}+3 layers x "
         f"{cfg['model'].get('d_model', 256)}, lr {args.lr:g} ({schedule(args)}), "
         f"{cfg['train']['max_tokens']} tokens per batch, {args.budget:g} s "
         f"each{together}, Multi30k en-de"),
        "",
        (f"Verdict: \"trains\" if the final logged train loss is below the "
         f"unigram floor {floor:.3f} (the smoothed loss of predicting token frequencies), "
         f"\"stalls\" if not, \"diverges\" if not finite; first loss: {first_row}. "
         f"BLEU: sacreBLEU on test2016, {decode}."),
        "",
    ]
    header = ["norm", "params", "updates", "tok/s", "first loss", "final loss", "min loss",
              "BLEU", "verdict"]
    body = [[r["norm"], f"{r['params']:,}", r["updates"], f"{r['tok_per_s']:.0f}",
             _fmt(r["first_loss"]), _fmt(r["final_loss"]), _fmt(r["min_loss"]),
             f"{r['bleu']:.2f}", r["verdict"]] for r in results]
    return "\n".join(lines + bench.markdown_table(header, body))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bench.add_study_arguments(ap, bench.ROOT / "runs" / "deep-stability", "both runs'")
    ap.add_argument("--layers", type=int, default=24, help="encoder layers (decoder: 3)")
    ap.add_argument("--lr", type=float, default=5e-4, help="peak learning rate")
    ap.add_argument("--warmup", type=int, default=1000, help="warm-up updates")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--log-every", type=int, default=20, help="updates per log.csv row")
    ap.add_argument("--beam", type=int, default=5, help="test decoding beam (1 = greedy)")
    ap.add_argument("--png", type=Path,
                    default=bench.ROOT / "docs" / "results" / "deep-stability.png")
    ap.add_argument("--data-bin", type=Path, default=None,
                    help="prepared Multi30k en-de data to reuse (default: WORKDIR/data-bin, "
                         "prepared if missing)")
    ap.add_argument("--parallel", action="store_true",
                    help="run post- and pre-norm at once, threads/2 each")
    args = ap.parse_args()
    args.run_threads = max(1, args.threads // 2) if args.parallel else args.threads
    if not (bench.SHARED / PAIR["corpus"]).is_dir():
        print(f"skipped: {bench.SHARED / PAIR['corpus']} not found (set XINDA_SHARED_DATA)")
        return
    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    data_bin = (args.data_bin or work / "data-bin").resolve()
    bench.set_threads(args.run_threads, 2 if args.parallel else 1)
    bench.prepare_once(stability_config(work, data_bin, "pre", args), work)

    results = bench.run_each(lambda norm: run_norm(work, data_bin, norm, args), NORMS,
                             args.parallel)
    floor = unigram_floor(data_bin, results[0]["config"]["train"]["label_smoothing"])
    for r in results:
        r["unigram_floor"] = round(floor, 4)
        r["verdict"] = verdict(r["final_loss"], floor)
    text = table(results, args, floor)
    plot(results, args.png.resolve(),
         f"{args.layers}-layer encoder, lr {args.lr:g} ({schedule(args)}): post- vs pre-norm",
         floor)
    bench.write_report(work, "deep-stability", text, results, args.png)


if __name__ == "__main__":
    main()
