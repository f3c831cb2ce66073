"""Quatrains (绝句): from a form and one to four keywords, write a four-line poem.

Data scheme (``write_poetry_corpus``, from ``poetry-quatrains``: Tang and Song 五言/七言绝句,
converted to simplified characters with OpenCC ``t2s``), files ``{split}.kw`` -> ``{split}.poem``:

- Target: the poem on one line, a "，" after lines 1 and 3 and a "。" after lines 2 and 4, no
  spaces: ``细韵风中远，寒青雪后浓。繁阴堪避雨，效用待东封。`` (``template`` gives the layout).
- Source: the form word (``五言`` or ``七言``, the characters per line) followed by the
  keywords, separated by single spaces, e.g. ``五言 避雨 东封`` (the keywords drawn for the
  poem above are ``咏诗``, from its title 北苑侍宴杂咏诗). Both sides go through the ``char``
  pre-tokeniser (``recipes/poetry.yaml``), so the source becomes ``五 言 ␣ 避 雨 ␣ 东 封``:
  every token is one character, the same tokens the decoder writes (the joint vocabulary ties
  a keyword's characters to the poem's), and "␣" marks where one keyword ends. A user's prompt
  is written the same way: ``七言 春风 江月``.
- Keywords, deterministic per poem: jieba's TF-IDF ranking (``jieba.analyse.extract_tags``) of
  the words of the title and the four lines, keeping words of two Han characters (its ranking
  skips one-character words) other than the numbering and form words of titles (其二, 三首,
  五绝, 绝句); words in jieba's dictionary rank before the others (the others are mostly
  segmentation fragments). Being words of the text, every keyword's characters occur in the
  title or poem. The number of keywords is drawn from 1-4 with
  ``random.Random(f"{seed}:{poem id}")``, so the model sees prompts of every size, and capped
  by the candidates; a poem without any candidate gets the first two characters of its first
  line. The chosen keywords are listed in the order they first occur in the title and poem.

Acrostic poems (藏头诗) and exact layouts are decoding constraints (``xinda.decode``): the
model is the same, the search fixes the first character of each line or the positions of the
punctuation given by ``template``.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from functools import cache
from pathlib import Path

from xinda.apps.corpus import (
    corpus_dir,
    drop_held_out,
    split_file,
    to_simplified,
    write_split,
)
from xinda.errors import XindaError
from xinda.evaluate.generation import is_han, line_mark, poem_lines, rhymes
from xinda.utils import read_lines

__all__ = ["FORMS", "is_han", "keywords", "poem_lines", "poem_text", "rhymes", "source_text",
           "template", "write_poetry_corpus"]

FORMS = {5: "五言", 7: "七言"}  # characters per line -> the source's form word
SIDES = ("kw", "poem")  # file suffixes: source, target
SPLITS = ("train", "valid", "test")  # {split}.jsonl (train: train.jsonl.gz)
MAX_KEYWORDS = 4
_KEYWORD_SEPARATORS = re.compile(r"[\s,，、;；]+")  # "春风 江月", "春风,江月", "春风，江月"
_NOT_KEYWORDS = re.compile(r"其[一二三四五六七八九十]|[一二三四五六七八九十]首|[五七]绝|绝句")


@cache
def _jieba():
    """jieba with its dictionary loaded (quietly) and ``jieba.analyse`` imported."""
    import jieba
    import jieba.analyse

    jieba.setLogLevel(60)  # no "Building prefix dict" chatter
    jieba.initialize()
    return jieba


def template(form: int, lines: int = 4) -> tuple[dict[int, str], int]:
    """The layout of a poem of ``lines`` lines of ``form`` characters: (position ->
    punctuation mark, total length). Line k (0-based) takes positions k*(form+1) ..
    k*(form+1)+form-1 and is followed by its ``line_mark`` ("，" when k is even, "。" when
    odd or last): ``template(5)`` -> ``({5: "，", 11: "。", 17: "，", 23: "。"}, 24)``."""
    if form < 1 or lines < 1:
        raise ValueError(f"a poem needs form >= 1 and lines >= 1, got {form}, {lines}")
    marks = {k * (form + 1) + form: line_mark(k, lines) for k in range(lines)}
    return marks, lines * (form + 1)


def poem_text(lines: Sequence[str]) -> str:
    """The poem's lines as one target line, with the marks of ``template``."""
    return "".join(line + line_mark(k, len(lines)) for k, line in enumerate(lines))


def split_keywords(text: str) -> tuple[str, ...]:
    """The keywords of a prompt, separated by spaces or by ASCII or Chinese commas (，、；)."""
    return tuple(word for word in _KEYWORD_SEPARATORS.split(text) if word)


def source_text(form: int, words: Sequence[str]) -> str:
    """The source line: the form word, then the keywords, space-separated (``五言 春 江月``)."""
    if form not in FORMS:
        raise XindaError(f"unknown poem form {form}: choose from {sorted(FORMS)}")
    return " ".join([FORMS[form], *words])


def keywords(title: str, lines: Sequence[str], count: int) -> list[str]:
    """Up to ``count`` keywords of a poem, as described in the module docstring."""
    text = "\n".join([title, *lines])
    jieba = _jieba()
    ranked = [w for w in jieba.analyse.extract_tags(text, topK=None)
              if len(w) == 2 and all(map(is_han, w)) and not _NOT_KEYWORDS.fullmatch(w)]
    known = [w for w in ranked if jieba.get_FREQ(w)]
    chosen = (known + [w for w in ranked if w not in known])[:count] or [lines[0][:2]]
    return sorted(chosen, key=text.index)


def _poem(record: object, where: str) -> tuple[str, list[str], str]:
    """(title, lines, id) of one JSON record, simplified; XindaError if it is not a quatrain."""
    if not isinstance(record, dict) or not {"id", "title", "lines"} <= record.keys():
        raise XindaError(f"{where}: expected an object with id, title and lines")
    if not isinstance(record["title"], str) or not isinstance(record["lines"], list) or \
            not all(isinstance(line, str) for line in record["lines"]):
        raise XindaError(f"{where}: title must be a string and lines a list of strings")
    lines = [to_simplified(line) for line in record["lines"]]
    if len(lines) != 4 or len({len(line) for line in lines}) != 1 or len(lines[0]) not in FORMS:
        raise XindaError(f"{where}: not a quatrain of 4 lines of 5 or 7 characters: {lines}")
    return to_simplified(record["title"]), lines, str(record["id"])


def _pairs(path: Path, seed: int) -> tuple[list[str], list[str]]:
    """The (source, target) lines of one JSON-lines split file."""
    sources, targets = [], []
    for lineno, raw in enumerate(read_lines(path), start=1):
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as err:
            raise XindaError(f"{path}:{lineno}: invalid JSON: {err.msg}") from None
        title, lines, poem_id = _poem(record, f"{path}:{lineno}")
        count = random.Random(f"{seed}:{poem_id}").randint(1, MAX_KEYWORDS)
        sources.append(source_text(len(lines[0]), keywords(title, lines, count)))
        targets.append(poem_text(lines))
    return sources, targets


def write_poetry_corpus(shared: str | Path, out_dir: str | Path, seed: int = 1
                        ) -> dict[str, str]:
    """Write ``{split}.kw`` (form and keywords) and ``{split}.poem`` under ``out_dir`` for
    train, valid and test of ``shared/poetry-quatrains``; return split -> prefix."""
    folder = corpus_dir(shared, "poetry-quatrains")
    splits = {split: list(_pairs(split_file(folder, f"{split}.jsonl"), seed)) for split in SPLITS}
    # a poem sharing a line with a later split's: the same poem once simplified, or a variant
    # (効/效 in one line, the lines in another order); 207 of 97,660 training poems
    drop_held_out(splits, ("train", "valid"), lambda record: set(poem_lines(record[1])))
    return {split: write_split(Path(out_dir), split, dict(zip(SIDES, sides)))
            for split, sides in splits.items()}
