"""A/B of ``decode.keep_heap`` (glibc keeps freed memory for the next decoder step): each
variant decodes the same sentences in a fresh process, alternated, medians kept.

    python benchmarks/keep_heap_ab.py --model runs/bench-en-de-1705-seed2/model
        [--sentences 500] [--rounds 4] [--threads 1] [--precision int8] [--beam 5]

The allocator setting is process-wide and cannot be undone, hence one process per decode.
Prints sentences/s per variant and the ratio; outputs must be identical. Not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from multi30k import SHARED

CHILD = """
import json, sys, time, torch
from xinda.decode.translator import Translator
model, n, threads, precision, beam, keep = sys.argv[1:7]
torch.set_num_threads(int(threads))
lines = open(sys.argv[7], encoding="utf-8").read().splitlines()[:int(n)]
tr = Translator.load(model)
opts = dict(beam=int(beam), batch_size=64, precision=precision, keep_heap=keep == "1")
tr.translate(lines[:64], **opts)  # warm-up: the int8 copy, first kernels
start = time.perf_counter()
out = tr.translate_text(lines, **opts)
print(json.dumps({"rate": len(lines) / (time.perf_counter() - start), "out": out}))
"""


def decode(args: argparse.Namespace, keep: bool) -> dict:
    test = SHARED / "multi30k" / "test2016.en"
    cmd = [sys.executable, "-c", CHILD, str(args.model), str(args.sentences), str(args.threads),
           args.precision, str(args.beam), "1" if keep else "0", str(test)]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--sentences", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--precision", default="int8")
    parser.add_argument("--beam", type=int, default=5)
    args = parser.parse_args()
    if not (SHARED / "multi30k" / "test2016.en").exists():
        sys.exit(f"skipped: needs {SHARED}/multi30k/test2016.en")
    rates: dict[bool, list[float]] = {True: [], False: []}
    outputs: dict[bool, list[str]] = {}
    for _ in range(args.rounds):
        for keep in (False, True):
            result = decode(args, keep)
            rates[keep].append(result["rate"])
            outputs[keep] = result["out"]
            print(f"keep_heap={keep}: {result['rate']:.1f} sentences/s", flush=True)
    off, on = statistics.median(rates[False]), statistics.median(rates[True])
    same = outputs[True] == outputs[False]
    print(f"median keep_heap=false {off:.1f}, true {on:.1f} sentences/s: {on / off:.2f}x; "
          f"identical outputs: {same}")


if __name__ == "__main__":
    main()
