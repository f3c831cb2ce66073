"""How many lines with a straight single quote (') come back exactly from Moses pre-tokenising
and detokenising (``TextPipeline.preprocess`` then ``postprocess``, no model): the lone ' tokens
that Moses leaves must be told apart as opening quotes, closing quotes and possessives
(``xinda/data/moses.py``, ``_single_quotes``).

    python benchmarks/quote_roundtrip.py [--out docs/results/quote_roundtrip.json]

Needs ../shared/data (XINDA_SHARED_DATA); a missing corpus is skipped with its reason. Takes a
few minutes (AESLC's e-mails and MedQuAD's answers are long).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from xinda.data.text import TextPipeline
from xinda.utils import read_lines

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("XINDA_SHARED_DATA", ROOT.parent / "shared" / "data"))

# (corpus file, Moses language): the sides the recipes pre-tokenise with Moses
CORPORA = [
    ("multi30k/train.en", "en"), ("multi30k/train.de", "de"), ("multi30k/train.fr", "fr"),
    ("multi30k/valid.en", "en"), ("multi30k/test2016.en", "en"), ("multi30k/test2016.de", "de"),
    ("tatoeba-zh-en/train.en", "en"),
    ("summarization-aeslc/train.doc.gz", "en"), ("summarization-aeslc/train.sum.gz", "en"),
    ("summarization-aeslc/valid.doc", "en"), ("summarization-aeslc/valid.sum", "en"),
    ("summarization-aeslc/test.doc", "en"),
    ("qa-medquad/train.a.gz", "en"), ("qa-medquad/valid.a", "en"), ("qa-medquad/test.a", "en"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = []
    for name, lang in CORPORA:
        path = SHARED / name
        if not path.is_file():
            print(f"skipped {name}: {path} is missing")
            continue
        pipe = TextPipeline("NFKC", False, "moses", lang)
        lines = [line for line in read_lines(path) if "'" in line]
        exact = sum(pipe.postprocess(pipe.preprocess(line)) == " ".join(pipe.clean(line).split())
                    for line in lines)
        rows.append({"corpus": name, "lang": lang, "lines_with_quote": len(lines), "exact": exact})
        print(f"{name}: {exact} of {len(lines)} lines with ' come back exactly", flush=True)
    total = {"lines_with_quote": sum(r["lines_with_quote"] for r in rows),
             "exact": sum(r["exact"] for r in rows)}
    print(f"all: {total['exact']} of {total['lines_with_quote']}")
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "total": total}, indent=1) + "\n",
                            encoding="utf-8")


if __name__ == "__main__":
    main()
