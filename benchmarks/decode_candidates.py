"""Beam search's candidate ranking and greedy search's argmax by vocabulary blocks, against the
whole-row ``torch.topk`` / ``argmax`` they replaced, in one process, alternated (issue 15).

    python benchmarks/decode_candidates.py --model MODEL_DIR [--sentences 1000] [--repeats 5]
        [--precision int8] [--threads 1] [--out docs/results/decode_candidates.json]

Decodes the first ``--sentences`` Multi30k test2016 sources (the model's own source side,
batches of 64) with beam 5 and greedily, once with ``xinda.decode.search``'s functions and once
with the whole-row references below patched in, alternated ``--repeats`` times; prints
sentences/s medians, the seconds spent inside the ranking function, and whether the outputs
are the same. Not a test: it takes a few minutes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch
from multi30k import SHARED

from xinda.decode import search
from xinda.decode.translator import Translator
from xinda.errors import XindaError


def whole_row_candidates(scores, logp, width, block=None):
    """The replaced ranking: each beam's ``width`` best tokens by ``topk`` over its whole row,
    then the sentence's ``width`` best of those K * width."""
    n, k = scores.shape
    row_width = min(width, logp.size(-1))
    row_logp, row_token = logp.topk(row_width, dim=-1)  # (N*K, W)
    cand = (scores[:, :, None] + row_logp.view(n, k, row_width)).view(n, -1)
    top_scores, top_idx = cand.topk(width, dim=1)
    return top_scores, top_idx // row_width, row_token.view(n, -1).gather(1, top_idx)


def whole_row_argmax(logp, block=None):
    return logp.argmax(dim=-1)


@contextmanager
def patched(name: str, function: Callable, seconds: list[float]):
    """``search.<name>`` replaced by ``function`` (or kept, if None), its time added up."""
    original = getattr(search, name)
    inner = function or original

    def timed(*args, **kwargs):
        start = time.perf_counter()
        out = inner(*args, **kwargs)
        seconds[0] += time.perf_counter() - start
        return out
    setattr(search, name, timed)
    try:
        yield
    finally:
        setattr(search, name, original)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--sentences", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--precision", default="int8")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    try:
        translator = Translator.load(args.model)
    except XindaError as err:
        sys.exit(f"error: {err}")
    test = SHARED / "multi30k" / f"test2016.{translator.cfg.data.src_lang}"
    if not test.exists():
        sys.exit(f"skipped: needs {test}")
    lines = test.read_text(encoding="utf-8").splitlines()[:args.sentences]
    searches = {"beam 5": ("_top_candidates", whole_row_candidates, 5),
                "greedy": ("argmax", whole_row_argmax, 1)}
    variants = {"blocks": None, "whole rows": "reference"}
    translator.translate(lines[:64], beam=5, batch_size=64, precision=args.precision)  # warm-up
    rows = []
    for label, (name, reference, beam) in searches.items():
        runs: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
        outputs: dict[str, list[str]] = {}
        for _ in range(args.repeats):
            for variant, which in variants.items():
                seconds = [0.0]
                with patched(name, reference if which else None, seconds):
                    start = time.perf_counter()
                    outputs[variant] = translator.translate_text(
                        lines, beam=beam, batch_size=64, precision=args.precision)
                    runs[variant].append((time.perf_counter() - start, seconds[0]))
        for variant, timings in runs.items():
            total = statistics.median(t for t, _ in timings)
            inside = statistics.median(s for _, s in timings)
            row = {"search": label, "variant": variant, "sentences_per_s": len(lines) / total,
                   "seconds": total, f"seconds_in_{name}": inside,
                   "runs": [round(t, 3) for t, _ in timings],
                   "same_outputs": outputs[variant] == outputs["blocks"]}
            rows.append(row)
            print(f"{label:7s} {variant:10s} {row['sentences_per_s']:6.1f} sentences/s, "
                  f"{inside:5.2f} s of {total:5.2f} in {name}, same outputs: "
                  f"{row['same_outputs']}", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"model": str(args.model), "sentences": len(lines),
                                        "precision": args.precision, "threads": args.threads,
                                        "repeats": args.repeats, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
