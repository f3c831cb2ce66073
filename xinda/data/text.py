"""Text cleaning and pre-tokenisation before sentencepiece, and its inverse for output.

``TextPipeline.preprocess`` = Unicode normalisation -> optional lowercasing -> control
characters to spaces, display-only format characters dropped, whitespace collapsed ->
pre-tokenisation (``moses``, ``jieba``, ``char`` or ``none``).
``TextPipeline.postprocess`` undoes the pre-tokenisation of model output (detokenisation).
The pipeline holds only its four settings (tokenizer objects are cached per process), so it
pickles cheaply and is rebuilt from ``manifest.json`` with ``TextPipeline(**settings)``. The
allowed settings are ``xinda.config``'s ``Normalization`` and ``Pretok``.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from functools import cache, lru_cache
from typing import get_args

from xinda.config import Normalization, Pretok
from xinda.utils import visible_text

SPACE_MARK = "\u2423"  # "␣": stands for an original space under char pre-tokenisation
_CLOSING = ",;:!?.)]}%"
_OPENING = "([{"
# Kept whole by the Moses tokeniser, whose detokeniser could not rejoin them: times, ratios
# and ranges ("10:30:45" would come back as "10:30: 45", "9:00–10:00" as "9:00 – 10:00")
# and, where sacremoses has no apostrophe rules, clitics ("geht's" would come back as
# "geht 's", read as an opening quote).
_MOSES_KEEP_TIMES = r"\d+(?:[:–]\d+)+"
_MOSES_KEEP_CLITICS = r"(?<![\w'])[^\W\d_]+'(?:s|t|d|m|ll|re|ve)\b"
# The typographic apostrophe and single quotes, which no sacremoses rule knows, stay on the
# letters they touch ("geht’s", "l’homme", "hab’", "‘Hello’" would come back as "geht ’ s"...).
_MOSES_KEEP_CURLY = r"[‘’][^\W\d_]+(?:’[^\W\d_]*)*|[^\W\d_]+(?:’[^\W\d_]*)+"
_MOSES_APOSTROPHE_LANGS = ("en", "fr", "it")


@cache
def _moses_tokenizer(lang: str):
    from sacremoses import MosesTokenizer

    return MosesTokenizer(lang=lang)


@cache
def _moses_protected(lang: str) -> tuple[str, ...]:
    if lang in _MOSES_APOSTROPHE_LANGS:
        return (_MOSES_KEEP_TIMES, _MOSES_KEEP_CURLY)
    return (_MOSES_KEEP_TIMES, _MOSES_KEEP_CLITICS, _MOSES_KEEP_CURLY)


@cache
def _moses_detokenizer(lang: str):
    from sacremoses import MosesDetokenizer

    return MosesDetokenizer(lang=lang)


@lru_cache(maxsize=1)
def _jieba():
    import logging

    import jieba

    jieba.setLogLevel(60)
    logging.getLogger("jieba").setLevel(60)
    return jieba


def _is_wide(char: str) -> bool:
    """CJK ideographs, kana, hangul and full-width punctuation (East Asian width W/F)."""
    return unicodedata.east_asian_width(char) in ("W", "F")


def _needs_space(before: str, left: str, right: str) -> bool:
    """Whether detokenised jieba output keeps a space between two tokens' boundary chars
    ``left`` and ``right`` (``before``: the character written before ``left``, or "")."""
    if _is_wide(left) or _is_wide(right):
        return False
    if left.isalnum() and right.isalnum():
        return True
    if left in _CLOSING and right.isalnum():
        if left in ",." and right.isdigit():
            return False  # "1,000", "3.5"
        if left == ":" and before.isdigit() and right.isdigit():
            return False  # "10:30", "3:2"
        # "www.google.com", "a@b.com": no sentence goes on in lower case after "."
        return not (left == "." and before.isalnum() and right.islower())
    return right in _OPENING and (left.isalnum() or left in _CLOSING)


def jieba_detokenize(text: str) -> str:
    """Join jieba tokens: no spaces around CJK, single spaces between Latin/digit words."""
    tokens = text.split()
    if not tokens:
        return ""
    out = tokens[0]
    for tok in tokens[1:]:
        before = out[-2] if len(out) > 1 else ""
        out += (" " if _needs_space(before, out[-1], tok[0]) else "") + tok
    return out


@dataclass(frozen=True)
class TextPipeline:
    """Normalise + pre-tokenise one language side; ``postprocess`` detokenises output."""

    normalize: Normalization
    lowercase: bool
    pretok: Pretok
    lang: str  # language code for the Moses (de)tokeniser

    def __post_init__(self) -> None:
        for name, allowed in (("normalize", Normalization), ("pretok", Pretok)):
            if getattr(self, name) not in get_args(allowed):
                raise ValueError(f"{name} must be one of {get_args(allowed)}, "
                                 f"got {getattr(self, name)!r}")

    def to_dict(self) -> dict:
        """The settings stored in the manifest; ``TextPipeline(**d)`` rebuilds the pipeline."""
        return asdict(self)

    def clean(self, line: str) -> str:
        """Normalisation, lowercasing, control characters to spaces (as ``xinda prepare`` does
        to valid/test lines), display-only format characters (BOM, zero-width space,
        bidirectional marks) dropped and whitespace collapsed (no tokenisation)."""
        line = visible_text(line)  # first: a dropped soft hyphen between a letter and its
        if self.normalize != "none":  # accent would keep them from composing
            line = unicodedata.normalize(self.normalize, line)
        if self.lowercase:
            line = line.lower()
        return " ".join(line.split())  # normalising can make spaces (NFKC: U+3000)

    def preprocess(self, line: str) -> str:
        """Raw line -> cleaned, pre-tokenised text ready for sentencepiece."""
        line = self.clean(line)
        if not line or self.pretok == "none":
            return line
        if self.pretok == "moses":
            return _moses_tokenizer(self.lang).tokenize(
                line, escape=False, aggressive_dash_splits=False, return_str=True,
                protected_patterns=list(_moses_protected(self.lang)))
        if self.pretok == "jieba":
            return " ".join(t for t in _jieba().lcut(line) if t.strip())
        return " ".join(SPACE_MARK if c == " " else c for c in line)  # char

    def preprocess_many(self, lines: Iterable[str]) -> list[str]:
        return [self.preprocess(line) for line in lines]

    def postprocess(self, text: str) -> str:
        """Decoded (pre-tokenised) model output -> plain text."""
        if self.pretok == "moses":
            return _moses_detokenizer(self.lang).detokenize(text.split())
        if self.pretok == "char":
            return " ".join(text.replace(" ", "").replace(SPACE_MARK, " ").split())
        if self.pretok == "jieba":
            return jieba_detokenize(text)
        return text
