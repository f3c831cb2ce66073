"""Text cleaning and pre-tokenisation before sentencepiece, and its inverse for output.

``TextPipeline.preprocess`` = Unicode normalisation -> optional lowercasing -> control
characters to spaces, display-only format characters dropped, whitespace collapsed ->
pre-tokenisation (``moses``, ``jieba``, ``char`` or ``none``).
``TextPipeline.postprocess`` undoes the pre-tokenisation of model output (detokenisation).
``clean`` writes U+2581 "▁" as "_": sentencepiece reads "▁" as a space, and would give it back
as one. Under ``char`` pre-tokenisation a space is the token "␣" and a "␣" of the text "␣␣".
The pipeline holds only its four settings (tokenizer objects are cached per process), so it
pickles cheaply and is rebuilt from ``manifest.json`` with ``TextPipeline(**settings)``. The
allowed settings are ``xinda.config``'s ``Normalization`` and ``Pretok``.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import get_args

from xinda.config import Normalization, Pretok
from xinda.data.moses import closing_alone, moses_detokenize, moses_has_rules, moses_tokenize
from xinda.utils import visible_text

SPACE_MARK = "\u2423"  # "␣": stands for an original space under char pre-tokenisation
_MARKS = re.compile(f"{SPACE_MARK}{SPACE_MARK}?")  # "␣" a space, "␣␣" a "␣" of the text
_CLOSING = ",;:!?.)]}%"
_OPENING = "([{$€£¥"  # (a currency sign opens its amount: "paid $200")
_CURLY_QUOTES = {"“": "open", "‘": "open", "”": "close", "’": "close"}
_IN_WORD_QUOTES = "'’"  # apostrophes between letters
# Words of letters and digits, also joined by in-word punctuation, stay one jieba token, so
# that detokenising need not guess whether a space was there: "www.google.com", "a_b@c.com",
# "10:30", "1,000", "3.5", "don't", "R&D", "and/or", "e-mail" (not "ok. then", "1, 2"), and
# words with letters outside ASCII, "Björk", "Привет" (jieba split them off: "Bj ö rk").
# ASCII, Latin-1 and Extended (also Additional: Vietnamese), combining marks, Greek, Cyrillic
_LATIN = "0-9A-Za-z_\u00c0-\u024f\u0300-\u04ff\u1e00-\u1eff"
_ACCENTED = "\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u0300-\u04ff\u1e00-\u1eff"  # less ASCII, × ÷
_JIEBA_KEEP = re.compile(f"(?<![{_LATIN}/])(?:https?|ftp)://[!-~]*[A-Za-z0-9/_=#&%~+-]|"
                         f"(?<![{_LATIN}])[{_LATIN}]+(?:[.,:@&/'’-][{_LATIN}]+)+|"  # and URLs
                         f"(?<![{_LATIN}])[{_LATIN}]*[{_ACCENTED}][{_LATIN}]*")
# So a token of these signs between two Latin words or numbers had spaces: "Tom & Jerry", "a - b"
_OPERATORS = frozenset("&+-=*/|<>~×÷–—")
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


def _is_letter(char: str) -> bool:
    """A letter, digit or combining mark of a script written with spaces (not CJK)."""
    return (char.isalnum() or unicodedata.category(char)[0] == "M") and not _is_wide(char)


def jieba_tokenize(line: str) -> str:
    """jieba's words of a cleaned ``line``, with ``_JIEBA_KEEP`` runs whole."""
    words, pos = [], 0
    for match in _JIEBA_KEEP.finditer(line):
        words += [*_jieba().lcut(line[pos:match.start()]), match.group()]
        pos = match.end()
    return " ".join(w for w in words + _jieba().lcut(line[pos:]) if w.strip())


def _quote_roles(tokens: list[str]) -> list[tuple[str | None, str | None]]:
    """Each token's first and last character as a quotation mark: "open", "close" or None.
    Straight quotes alternate (an apostrophe between two letters is none; of an odd count of
    lone ', one may close alone: ``closing_alone``), curly ones point their way."""
    roles, unclosed = [], set()
    alone = closing_alone(tokens, [i for i, tok in enumerate(tokens) if tok == "'"])
    for k, tok in enumerate(tokens):
        role = []
        for i, c in enumerate(tok):
            if c in _IN_WORD_QUOTES and 0 < i < len(tok) - 1 and _is_letter(tok[i - 1]) \
                    and _is_letter(tok[i + 1]):
                role.append(None)
            elif k in alone:  # (a plural possessive: "girls ' school")
                role.append("close")
            elif c in "'\"":
                role.append("close" if c in unclosed else "open")
                unclosed ^= {c}
            else:
                role.append(_CURLY_QUOTES.get(c))
        roles.append((role[0], role[-1]))
    return roles


def _needs_space(before: str, left: str, right: str,
                 roles: tuple[str | None, str | None], after: str = " ") -> bool:
    """Whether detokenised jieba output keeps a space between two tokens, ``left`` and
    ``right``; ``roles``: the quotation-mark roles of ``left[-1]`` and ``right[0]``;
    ``before``: the character written before ``left[-1]`` (a space at the start); ``after``:
    the first one of the token after ``right`` (a space at the end)."""
    a, b = left[-1], right[0]
    if _is_wide(a) or _is_wide(b):
        return False
    if a in "#+" and _is_letter(left.rstrip("#+")[-1:] or " ") and _is_letter(b):
        return True  # a word that ends in them, "C# and", "C++ daily"
    # a quotation mark between two letters would read as an apostrophe (jieba keeps those)
    if (a == "'" and len(left) > 1 and _is_letter(left[-2]) and _is_letter(b)) or \
            (b == "'" and len(right) > 1 and _is_letter(right[1]) and _is_letter(a)):
        return True
    if roles[0] == "open" or roles[1] == "close":
        return False
    if roles[1] == "open" and roles[0] == "close":  # two quotations: spaced in Latin text
        return not (_is_wide(before) or _is_wide(after))  # ("“吗?” “不”" came back)
    if roles[1] == "open":  # not after Chinese punctuation (NFKC: "：" to ":")
        return _is_letter(a) or (a in _CLOSING and not _is_wide(before))
    if roles[0] == "close" or _is_letter(a) or a in _CLOSING:
        return b.isalnum() or b in _OPENING
    return False


def jieba_detokenize(text: str) -> str:
    """Join jieba tokens: no spaces around CJK, single spaces between Latin/digit words, after
    punctuation, around quotations and around operators between Latin words."""
    tokens = text.split()
    if not tokens:
        return ""
    roles = _quote_roles(tokens)
    spaced = {i for i in range(1, len(tokens) - 1) if set(tokens[i]) <= _OPERATORS
              and _is_letter(tokens[i - 1][-1]) and _is_letter(tokens[i + 1][0])}
    out = tokens[0]
    for i in range(1, len(tokens)):
        before, pair = out[-2] if len(out) > 1 else " ", (roles[i - 1][1], roles[i][0])
        after = tokens[i + 1][0] if i + 1 < len(tokens) else " "
        space = {i, i - 1} & spaced or _needs_space(before, tokens[i - 1], tokens[i], pair, after)
        out += (" " if space else "") + tokens[i]
    return out


# What NFKC folds to ASCII in Chinese and Japanese text (U+FF0C "，" to ","...), put back by
# ``restore_wide_punctuation`` where one of their characters touches it (not Korean's: Hangul
# is written with ASCII punctuation)
_NFKC_FOLDED = dict(zip(",:;?!()", "，：；？！（）"))
_HAN_KANA = re.compile("[\u3000-\u30ff\u3100-\u312f\u3400-\u4dbf\u4e00-\u9fff"
                       "\uf900-\ufaff\U00020000-\U0002fa1f]")  # (not the restored ones)
_FOLDED_RUN = re.compile("[,:;?!()](?:[ ,:;?!()]*[,:;?!()])?")  # marks, maybe spaced
_DOTS = re.compile(r"(?<!\.)\.{3,}(?!\.)")  # NFKC folds "…" to "..."
_SPACED_WIDE = re.compile(" ?([，：；？！（）…]) ?")
_HALF_PAIRED = re.compile("（([^()（）]*)\\)|\\(([^()（）]*)）")


def _touches_han_kana(text: str, start: int, end: int) -> bool:
    """Whether a Han or kana character is next to ``text[start:end]``, spaces aside."""
    before, after = start - 1, end
    while before >= 0 and text[before] == " ":
        before -= 1
    while after < len(text) and text[after] == " ":
        after += 1
    return bool(_HAN_KANA.search((text[before] if before >= 0 else "") + text[after:after + 1]))


def restore_wide_punctuation(text: str) -> str:
    """``text`` with ``, : ; ? ! ( )`` next to a Han or kana character (spaces and other such
    marks between aside) full-width again, as Chinese and Japanese write them (NFKC made them
    ASCII: references keep "，", so a perfect model's output scored 80 BLEU on
    classical-modern Chinese), and a run of 3·n dots there n "…" (NFKC: "……" to "......");
    "3:30", "Hello, world" and "wait..." stay. Pre-tokenised text too ("世界 ! ( 测试 )");
    applying it twice changes nothing more."""
    def put_back(run: re.Match) -> str:
        if not _touches_han_kana(text, run.start(), run.end()):
            return run[0]
        return "".join(_NFKC_FOLDED.get(c, c) for c in run[0])

    def ellipsis(run: re.Match) -> str:
        dots = len(run[0])
        if dots % 3 or not _touches_han_kana(text, run.start(), run.end()):
            return run[0]
        return "\u2026" * (dots // 3)
    text = _FOLDED_RUN.sub(put_back, text)
    text = _DOTS.sub(ellipsis, text)
    # a bracket pair takes one form: 問題（1) -> 問題（1）
    return _HALF_PAIRED.sub(lambda m: f"（{m[1] or m[2]}）", text)


# write "，：（）" full-width (ISO 639-1/2/3 codes, and the suffixes "cn", "jp")
WIDE_PUNCTUATION_LANGS = ("zh", "zho", "chi", "cmn", "lzh", "yue", "wuu", "cn", "ja", "jpn", "jp")


def _mostly_han_kana(text: str) -> bool:
    """Whether at least half of ``text``'s letters are Han or kana."""
    return 2 * len(_HAN_KANA.findall(text)) >= sum(c.isalpha() for c in text) > 0


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
        return " ".join(line.replace("\u2581", "_").split())  # NFKC can make spaces (U+3000)

    def preprocess(self, line: str) -> str:
        """Raw line -> cleaned, pre-tokenised text ready for sentencepiece."""
        line = self.clean(line)
        if not line or self.pretok == "none":
            return line
        if self.pretok == "moses":
            return moses_tokenize(line, self.lang)
        if self.pretok == "jieba":
            return jieba_tokenize(line)
        marks = {" ": SPACE_MARK, SPACE_MARK: SPACE_MARK * 2}  # char (all other tokens: 1 char)
        return " ".join(marks.get(c, c) for c in line)

    def preprocess_many(self, lines: Iterable[str]) -> list[str]:
        return [self.preprocess(line) for line in lines]

    def postprocess(self, text: str) -> str:
        """Decoded (pre-tokenised) model output -> plain text (with NFKC, its CJK punctuation
        full-width again where ``restores_wide_punctuation``)."""
        if not self.restores_wide_punctuation(text):
            return self._detokenize(text)
        if self.pretok == "jieba":  # before detokenising too: jieba's spaces ASCII punctuation
            text = restore_wide_punctuation(text)
        text = restore_wide_punctuation(self._detokenize(text))  # (char's ␣ hid neighbours)
        # Moses spaces the marks as words (it knows ASCII ones only); CJK writes none there
        return _SPACED_WIDE.sub(r"\1", text) if self.pretok == "moses" else text

    def restores_wide_punctuation(self, text: str) -> bool:
        """Whether ``postprocess`` puts NFKC's ASCII marks back full-width in ``text``
        (``restore_wide_punctuation``): in Chinese and Japanese sides, sides of other names
        (the couplet recipe's "up"/"down", "cn"), and lines mostly of Han or kana; a side of
        a language written with spaces that Moses knows (en, de, ...) keeps the ASCII
        "(李白):" of a Chinese name in an English line."""
        lang = re.split("[-_]", self.lang.lower())[0]
        return self.normalize == "NFKC" and (lang in WIDE_PUNCTUATION_LANGS or not
                                             moses_has_rules(lang) or _mostly_han_kana(text))

    def _detokenize(self, text: str) -> str:
        if self.pretok == "moses":
            return moses_detokenize(text, self.lang)
        if self.pretok == "char":
            chars = (_MARKS.sub(lambda m: m[0][1:] or " ", tok) for tok in text.split())
            return " ".join("".join(chars).split())
        if self.pretok == "jieba":
            return jieba_detokenize(text)
        return text
