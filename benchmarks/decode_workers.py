"""How to spend N cores on decoding: 1 thread, N torch threads in one process, or N one-thread
processes (``decode.workers``), on the same model and sentences, interleaved, medians kept.

    python benchmarks/decode_workers.py --model MODEL_DIR [--cores 2] [--sentences 500]
        [--precision int8] [--beam 5] [--repeats 3] [--out docs/results/decode_workers.json]

Decodes the first ``--sentences`` Multi30k test2016 sources (the model's own pre-processing,
batches of 64); prints sentences/s per variant and whether its outputs equal the 1-thread
ones. Not a test: it takes a few minutes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from multi30k import SHARED

from xinda.decode.translator import Translator
from xinda.errors import XindaError


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--sentences", type=int, default=500)
    ap.add_argument("--precision", default="int8")
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.cores < 2:
        ap.error("--cores must be at least 2 (1 thread is always measured)")
    try:
        translator = Translator.load(args.model)
    except XindaError as err:
        sys.exit(f"error: {err}")
    src = translator.cfg.data.src_lang
    test = SHARED / "multi30k" / f"test2016.{src}"
    if not test.exists():
        sys.exit(f"skipped: needs {test}")
    lines = test.read_text(encoding="utf-8").splitlines()[:args.sentences]
    variants = {"1 thread": (1, 1), f"{args.cores} threads": (args.cores, 1),
                f"{args.cores} workers": (1, args.cores)}  # name: (torch threads, workers)
    options = {"beam": args.beam, "batch_size": 64, "precision": args.precision}
    translator.translate(lines[:64], **options)  # warm-up: the int8 copy, first kernels
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    outputs: dict[str, list[str]] = {}
    for _ in range(args.repeats):
        for name, (threads, workers) in variants.items():
            torch.set_num_threads(threads)
            start = time.perf_counter()
            outputs[name] = translator.translate_text(lines, workers=workers, **options)
            seconds[name].append(time.perf_counter() - start)
            print(f"{name}: {len(lines) / seconds[name][-1]:.1f} sentences/s", flush=True)
    rows = {name: {"sents_per_s": round(len(lines) / statistics.median(seconds[name]), 1),
                   "same_outputs_as_1_thread": outputs[name] == outputs["1 thread"]}
            for name in variants}
    for name, row in rows.items():
        print(f"{name}: median {row['sents_per_s']} sentences/s, "
              f"same outputs as 1 thread: {row['same_outputs_as_1_thread']}")
    if args.out:
        meta = {**vars(args), "model": str(args.model), "out": str(args.out),
                "sentences": len(lines), "torch": torch.__version__}
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
