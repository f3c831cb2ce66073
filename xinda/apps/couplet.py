"""Couplets (对联): given the first line (上联), write the second (下联).

The rules a second line follows. The metrics of ``xinda.evaluate.generation`` check, and
constrained decoding enforces, 1, the repetition pattern of 4 and the final tones of 3 (with
``--tone``); parallelism (2) and the tones inside the lines are left to the model:

1. Equal length (字数相等): as many characters as the first line, with any punctuation at the
   same positions.
2. Parallelism (对仗): the characters at each position match in word class and structure
   (noun with noun, number with number, 天 with 地).
3. Tones (平仄): the first line ends on an oblique tone (仄) and the second on a level tone (平)
   (上仄下平); within the lines, tones at corresponding positions are opposed.
4. Repetition (重字): the second line repeats characters exactly where the first does
   (``repetition_pattern``: 一心一意 -> 三番三次; enforced). It should not reuse the first
   line's characters: at the same position only ``--no-copy`` forbids it (the "copy" metric
   counts it); at other positions (不同位重字) nothing enforces or counts it.

Data (``write_couplet_corpus``): no couplet training set could be obtained (see SOURCES.md), so
train/valid/test are the parallel middle couplets (颔联, 颈联) of Tang and Song regulated verse
(``poetry-couplets``, traditional characters, converted to simplified with OpenCC ``t2s``),
and split ``wb14123`` is the wb14123 couplet test set (``couplet``, already simplified). Each
line is written without the spaces that separate the characters in the source files; the
recipe's ``pretok_src/pretok_tgt: char`` splits them again.
"""

from __future__ import annotations

from pathlib import Path

from xinda.apps.corpus import (
    corpus_dir,
    drop_held_out,
    read_aligned,
    split_file,
    to_simplified,
    write_split,
)
from xinda.evaluate.generation import is_punctuation, repetition_pattern

__all__ = ["SIDES", "is_punctuation", "repetition_pattern", "write_couplet_corpus"]

SIDES = ("up", "down")  # file suffixes: first line, second line
POETRY_SPLITS = ("train", "valid", "test")  # from poetry-couplets/ (train is gzipped)
WB14123 = "wb14123"  # the split name of couplet/test


def _convert(line: str) -> str:
    """Spaces removed, then simplified: OpenCC converts the joined line by its phrases (乾坤
    stays 乾坤; character by character it became 干坤, and 乾, which wb14123 uses, was
    missing from the vocabulary). The length does not change on any line of the data."""
    return to_simplified(line.replace(" ", ""))


def write_couplet_corpus(shared: str | Path, out_dir: str | Path) -> dict[str, str]:
    """Write ``{split}.up`` and ``{split}.down`` under ``out_dir`` for train, valid, test
    (poetry-couplets) and wb14123 (couplet/test) from the shared data folder ``shared``; return
    split -> prefix, e.g. ``{"train": "out_dir/train", ...}``."""
    poetry, couplet = corpus_dir(shared, "poetry-couplets"), corpus_dir(shared, "couplet")
    splits = {split: [[_convert(line) for line in lines] for lines in read_aligned(
        [split_file(poetry, f"{split}.{side}") for side in SIDES])] for split in POETRY_SPLITS}
    splits[WB14123] = [[line.replace(" ", "") for line in lines] for lines in read_aligned(
        [split_file(couplet, f"test.{side}") for side in SIDES])]
    drop_held_out(splits, ("train", "valid"), set)  # no line of a later split
    return {split: write_split(Path(out_dir), split, dict(zip(SIDES, sides)))
            for split, sides in splits.items()}

