"""What the text pipeline alone costs a perfect model: each test reference goes through
``TextPipeline.preprocess`` and ``postprocess`` (normalisation, pre-tokenisation and their
inverse; no sentencepiece, no model) and is scored against itself as ``xinda evaluate`` scores
(sacreBLEU, its tokenizer picked the same way; ``--lowercase`` where the pipeline lowercases).
Anything below 100 is lost before training starts.

    python benchmarks/text_roundtrip.py [--out docs/results/text_roundtrip]

Rows with NFKC also show the score without the full-width restoration of CJK punctuation
(``restore_wide_punctuation``, added 2026-11-25), i.e. what the pipeline gave before it.
Needs ../shared/data (XINDA_SHARED_DATA); a missing corpus is skipped with its reason.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from xinda.data.text import TextPipeline
from xinda.evaluate.metrics import corpus_scores
from xinda.utils import read_lines

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("XINDA_SHARED_DATA", ROOT.parent / "shared" / "data"))

# (corpus file, Moses language, normalisation, lowercase, pre-tokenisations)
CASES = [
    ("classical-modern/test.zh", "zh", "NFKC", False, ("none", "jieba", "char")),
    ("classical-modern/test.zh", "zh", "NFC", False, ("none",)),
    ("classical-modern/test.lzh", "zh", "NFKC", False, ("none",)),
    ("tatoeba-zh-en/test.zh", "zh", "NFKC", False, ("none", "jieba", "char")),
    ("tatoeba-zh-en/test.en", "en", "NFKC", False, ("moses",)),
    ("multi30k/test2016.de", "de", "NFKC", False, ("moses",)),
    ("multi30k/test2016.de", "de", "NFKC", True, ("moses",)),
    ("multi30k/test2016.en", "en", "NFKC", False, ("moses",)),
    ("iwslt14-de-en/test.en", "en", "NFKC", False, ("moses",)),
]


def bleu(hyps: list[str], refs: list[str], lowercase: bool = False) -> float:
    return round(corpus_scores(hyps, refs, ("bleu",), lowercase=lowercase)[0].score, 2)


def measure(path: Path, lang: str, normalize: str, lowercase: bool, pretok: str) -> dict:
    refs = list(read_lines(path))
    pipe = TextPipeline(normalize, lowercase, pretok, lang)
    tokens = [pipe.preprocess(line) for line in refs]
    out = [pipe.postprocess(t) for t in tokens]
    row = {"corpus": str(path.relative_to(SHARED)), "lines": len(refs), "normalize": normalize,
           "lowercase": lowercase, "pretok": pretok, "bleu": bleu(out, refs),
           "lines_changed": sum(o != r for o, r in zip(out, refs))}
    if lowercase:
        row["bleu_evaluate_lowercase"] = bleu(out, refs, lowercase=True)
    if normalize == "NFKC":  # the detokeniser alone, as before the restoration
        row["bleu_without_wide_restore"] = bleu([pipe._detokenize(t) for t in tokens], refs)
    row["examples"] = [[r, o] for o, r in zip(out, refs) if o != r][:3]
    return row


def report(rows: list[dict]) -> str:
    lines = [("| corpus | normalize | lowercase | pretok | lines | changed | BLEU | "
             "BLEU --lowercase | BLEU before the full-width restore |"),
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['corpus']} | {r['normalize']} | {r['lowercase']} | {r['pretok']} | "
                     f"{r['lines']} | {r['lines_changed']} | {r['bleu']:.2f} | "
                     f"{r.get('bleu_evaluate_lowercase', '–')} | "
                     f"{r.get('bleu_without_wide_restore', '–')} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "results" / "text_roundtrip"))
    args = parser.parse_args()
    rows = []
    for name, lang, normalize, lowercase, pretoks in CASES:
        path = SHARED / name
        if not path.is_file():
            print(f"skipped {name}: not in {SHARED}")
            continue
        for pretok in pretoks:
            rows.append(measure(path, lang, normalize, lowercase, pretok))
            print(f"{name} {normalize} lowercase={lowercase} {pretok}: BLEU {rows[-1]['bleu']}",
                  flush=True)
    table = report(rows)
    print(table)
    Path(f"{args.out}.json").write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n",
                                        encoding="utf-8")
    Path(f"{args.out}.md").write_text("# Text pipeline round trip (perfect-model BLEU)\n\n"
                                      + table, encoding="utf-8")


if __name__ == "__main__":
    main()
