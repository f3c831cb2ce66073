"""How many outputs change with the sentences batched beside them, per precision: the first N
test sentences decoded each alone and all in one batch, beam search, one thread.

    python benchmarks/batch_dependence.py --model MODEL_DIR [--sentences 100] [--beam 5]
        [--source FILE] [--out docs/results/batch-dependence.json]

int8 quantises a call's activations by the range of the whole batch (``xinda/models/
quantize.py``), so one sentence's output may depend on its neighbours; "int8-row" (int8 with
``decode.int8_scale: row``) scales each row by itself, so only float rounding that depends on
the padding (as in fp32 and bf16) can tip a choice. Prints and writes, per precision, the
sentences whose output differs and their BLEU either way. Not a test.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import sacrebleu
import torch
from multi30k import SHARED  # ($XINDA_SHARED_DATA, else ../shared/data)

from xinda.decode.translator import Translator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--source", type=Path,
                        help="default: Multi30k's test2016 in the model's source language")
    parser.add_argument("--sentences", type=int, default=100)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--precisions", default="fp32,bf16,int8,int8-row")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not (args.model / "config.yaml").is_file():
        sys.exit(f"{args.model}: not a trained model directory (no config.yaml)")
    torch.set_num_threads(1)
    translator = Translator.load(args.model)
    source = args.source or SHARED / "multi30k" / f"test2016.{translator.cfg.data.src_lang}"
    if not source.is_file():
        sys.exit(f"skipped: {source} is missing (the Multi30k test set of ../shared/data)")
    lines = source.read_text(encoding="utf-8").splitlines()[:args.sentences]
    rows = []
    for precision in args.precisions.split(","):
        options = {"beam": args.beam, "precision": precision.removesuffix("-row"),
                   "int8_scale": "row" if precision.endswith("-row") else "batch"}
        batched = translator.translate_text(lines, batch_size=len(lines), **options)
        alone = [translator.translate_text([line], **options)[0] for line in lines]
        changed = [i + 1 for i, (a, b) in enumerate(zip(alone, batched)) if a != b]
        rows.append({"precision": precision, "sentences": len(lines), "changed": len(changed),
                     "changed_lines": changed,
                     "bleu_alone_vs_batched": round(sacrebleu.corpus_bleu(
                         alone, [batched]).score, 2)})
        print(f"{precision}: {len(changed)} of {len(lines)} outputs differ alone vs batched "
              f"(lines {changed[:20]}{' ...' if len(changed) > 20 else ''})", flush=True)
    result = {"model": str(args.model), "source": str(source), "beam": args.beam,
              "threads": 1, "torch": torch.__version__, "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
