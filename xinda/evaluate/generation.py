"""Metrics for generated Chinese text (couplets, poems) and the character helpers they rest on.

Every metric is one small function whose docstring gives its definition. Lines are compared as
sequences of their non-whitespace characters, so char-tokenised output ("细 韵 风") and plain
text ("细韵风") score the same. Percentages are 0-100; ``distinct_n`` is a ratio in [0, 1]
(after Li et al. 2016).

Tones and rhymes are those of modern Standard Mandarin from pypinyin, read from each character
alone with pypinyin's default (most frequent) reading: level tone 平 = tones 1 and 2, oblique
tone 仄 = tones 3 and 4 (the 新韵 convention; the old entering tone 入声 is not recovered, so
e.g. 白 bai2 counts as level). The default reading is a deliberate choice: requiring all of a
character's readings to agree leaves line endings such as 知 (zhi1, zhi4) undecided, and
measured on the poetry-couplets test set the second lines of the reference pairs met the tone
rule 95% of the time with default readings but 69% with all readings. A default reading in
the neutral tone (子 zi5, 了 le5, 裳 shang5) gives way to the character's first toned reading
(zi3, liao3, chang2). Other polyphonic characters whose default reading is not the poetic one
(长 zhang3 for chang2) are scored by the default reading.

Rhyme groups are the fourteen rhymes of 中华新韵 (Chinese Poetry Society, 2005), by pinyin
final: a medial i/u/ü does not change the group (ang, iang, uang rhyme), en/in/un/ün share one
group and eng/ing/ong/iong another, and the apical i of zhi chi shi ri zi ci si (支) is kept
apart from the i of ji qi xi (齐).

The apps (``xinda.apps``) import these helpers: evaluation sits below them in the layers.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from functools import cache
from typing import NamedTuple

from pypinyin import Style, pinyin
from pypinyin.contrib.tone_convert import to_finals, to_initials

from xinda.errors import XindaError

LEVEL, OBLIQUE = "平", "仄"
LINE_BREAKS = "，。！？；、"  # full-width marks that end a line of verse

_HAN_RANGES = (
    (0x3007, 0x3007),  # 〇 ideographic number zero (líng)
    (0x3400, 0x4DBF),  # CJK ext. A
    (0x4E00, 0x9FFF),  # CJK unified ideographs
    (0xF900, 0xFAFF),  # CJK compatibility ideographs
    (0x20000, 0x323AF),  # CJK ext. B-H and the compatibility supplement
)

# 中华新韵: rhyme group -> the strict pinyin finals (pypinyin's spelling, ü = v) in it
_RHYME_GROUPS = {
    "麻": ("a", "ia", "ua"),
    "波": ("o", "e", "uo", "io"),
    "皆": ("ie", "ve", "ê"),
    "开": ("ai", "uai"),
    "微": ("ei", "uei"),
    "豪": ("ao", "iao"),
    "尤": ("ou", "iou"),
    "寒": ("an", "ian", "uan", "van"),
    "文": ("en", "in", "uen", "vn"),
    "唐": ("ang", "iang", "uang"),
    "庚": ("eng", "ing", "ong", "iong", "ueng"),
    "齐": ("i", "er", "v"),
    "支": (),  # the apical i after zh ch sh r z c s (see rhyme_group)
    "姑": ("u",),
}
_GROUP_OF_FINAL = {f: group for group, finals in _RHYME_GROUPS.items() for f in finals}
_APICAL_INITIALS = ("zh", "ch", "sh", "r", "z", "c", "s")


# --- characters -------------------------------------------------------------------------------

def is_han(ch: str) -> bool:
    """Whether ``ch`` is a Chinese (Han) character: a CJK unified or compatibility ideograph,
    or 〇."""
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in _HAN_RANGES)


def is_punctuation(ch: str) -> bool:
    """Whether ``ch`` is punctuation: Unicode general category P* (，。、！ ,.《》 ...)."""
    return unicodedata.category(ch).startswith("P")


_PINYIN = re.compile("[a-z]+[1-5]")  # a TONE3 reading ("v" for ü)


@cache
def _reading(ch: str) -> str | None:
    """pypinyin's default reading of ``ch`` alone with a tone number 1-5 (5 = neutral), e.g.
    "jiang1", or its first toned reading when the default is neutral (子 zi5 -> zi3, 裳 shang5
    -> chang2): a character standing alone in verse is not in a neutral tone. None for a
    non-Han character or one pypinyin has no reading for (𫈟)."""
    if len(ch) != 1 or not is_han(ch):
        return None
    readings = pinyin(ch, style=Style.TONE3, neutral_tone_with_five=True, heteronym=True)[0]
    readings = [r for r in readings if _PINYIN.fullmatch(r)]  # not 𫈟5: pypinyin knows no reading
    toned = [r for r in readings if not r.endswith("5")]
    return (toned or readings or [None])[0]


def tone(ch: str) -> int | None:
    """The tone of ``ch`` (see ``_reading``): 1-4, or 5 when pypinyin knows only neutral
    readings; None when it is not a Han character (or has no reading)."""
    reading = _reading(ch)
    return None if reading is None else int(reading[-1])


def level_oblique(ch: str) -> str | None:
    """平 (``LEVEL``) for tones 1 and 2, 仄 (``OBLIQUE``) for tones 3 and 4, else None."""
    return {1: LEVEL, 2: LEVEL, 3: OBLIQUE, 4: OBLIQUE}.get(tone(ch))


def final(ch: str) -> str | None:
    """The pinyin final of ``ch`` with its medial, without tone, strict spelling: 江 -> "iang",
    光 -> "uang", 回 -> "uei", 雨 -> "v"; None when it is not a Han character."""
    reading = _reading(ch)
    return None if reading is None else to_finals(reading, strict=True)


def rhyme_group(ch: str) -> str | None:
    """The 中华新韵 rhyme group of ``ch`` (e.g. 江, 光 and 长 -> "唐"), or None for a non-Han
    character. A final outside the table (嗯 n) is its own group."""
    reading = _reading(ch)
    if reading is None:
        return None
    fin = to_finals(reading, strict=True)
    if fin == "i" and to_initials(reading, strict=True) in _APICAL_INITIALS:
        return "支"
    return _GROUP_OF_FINAL.get(fin, fin or reading[:-1])


# --- lines ------------------------------------------------------------------------------------

def chars(line: str) -> str:
    """``line`` without whitespace: the characters the metrics compare."""
    return "".join(line.split())


def last_han(line: str) -> str | None:
    """The last Han character of ``line`` (trailing punctuation skipped), or None."""
    return next((ch for ch in reversed(line) if is_han(ch)), None)


def poem_lines(text: str) -> list[str]:
    """Split a poem into its lines at the full-width marks ``LINE_BREAKS`` (，。！？；、),
    without the marks, whitespace or empty pieces: "白日依山尽，黄河入海流。" -> two lines."""
    pieces = re.split(f"[{LINE_BREAKS}]", chars(text))
    return [piece for piece in pieces if piece]


def _ending(line: str, feature: Callable[[str], str | None]) -> str | None:
    """``feature`` of the last Han character of ``line``; None when the line has none."""
    ch = last_han(line)
    return None if ch is None else feature(ch)


def rhymes(a: str, b: str) -> bool:
    """Whether lines ``a`` and ``b`` rhyme: their last Han characters are in the same rhyme
    group (a line without a Han character rhymes with nothing)."""
    group = _ending(a, rhyme_group)
    return group is not None and group == _ending(b, rhyme_group)


def repetition_pattern(line: str) -> list[int | None]:
    """For each position i, the first earlier position j with ``line[j] == line[i]``, else
    None: 一心一意 -> [None, None, 0, None]. Two lines of equal length have equal patterns
    exactly when ``a[i] == a[j]`` iff ``b[i] == b[j]`` for all i, j."""
    first: dict[str, int] = {}
    pattern: list[int | None] = []
    for i, ch in enumerate(line):
        pattern.append(first.get(ch))
        first.setdefault(ch, i)
    return pattern


# --- metrics ----------------------------------------------------------------------------------

class RuleRate(NamedTuple):
    """A percentage and the number of cases it is over (the rule applies to only some)."""

    rate: float  # 0-100; 0.0 when count is 0
    count: int


def _check_pairs(srcs: Sequence[str], hyps: Sequence[str]) -> None:
    if len(srcs) != len(hyps):
        raise XindaError(f"sources have {len(srcs)} lines but hypotheses have {len(hyps)}")
    if not hyps:
        raise XindaError("no hypotheses to score (empty input)")


def _percent(hits: int, total: int) -> float:
    return 100.0 * hits / total if total else 0.0


def length_match(srcs: Sequence[str], hyps: Sequence[str]) -> float:
    """% of pairs whose hypothesis has as many characters as its source (punctuation
    included, whitespace not)."""
    _check_pairs(srcs, hyps)
    return _percent(sum(len(chars(s)) == len(chars(h)) for s, h in zip(srcs, hyps)), len(hyps))


def pattern_match(srcs: Sequence[str], hyps: Sequence[str]) -> float:
    """% of pairs whose hypothesis mirrors the source's repetitions: equal length and, for all
    positions i, j, ``hyp[i] == hyp[j]`` iff ``src[i] == src[j]`` (一心一意 -> 三番三次 matches,
    三番两次 does not)."""
    _check_pairs(srcs, hyps)
    hits = sum(repetition_pattern(chars(s)) == repetition_pattern(chars(h))
               for s, h in zip(srcs, hyps))
    return _percent(hits, len(hyps))


def tone_rule_rate(srcs: Sequence[str], hyps: Sequence[str]) -> RuleRate:
    """The couplet's tone rule 上仄下平: among the pairs whose first line (source) ends on an
    oblique tone (its last Han character has tone 3 or 4), the % whose second line
    (hypothesis) ends on a level tone (its last Han character has tone 1 or 2); ``count`` is
    the number of those pairs. A hypothesis without a Han character fails the rule."""
    _check_pairs(srcs, hyps)
    ends = [(_ending(s, level_oblique), _ending(h, level_oblique)) for s, h in zip(srcs, hyps)]
    applicable = [hyp_end for src_end, hyp_end in ends if src_end == OBLIQUE]
    return RuleRate(_percent(applicable.count(LEVEL), len(applicable)), len(applicable))


def rhyme_rate(poems: Sequence[str]) -> float:
    """% of poems whose 2nd and 4th lines (``poem_lines``) rhyme (``rhymes``); a poem with
    fewer than four lines fails."""
    if not poems:
        raise XindaError("no poems to score (empty input)")
    hits = 0
    for poem in poems:
        lines = poem_lines(poem)
        hits += len(lines) >= 4 and rhymes(lines[1], lines[3])
    return _percent(hits, len(poems))


def line_mark(k: int, lines: int) -> str:
    """The mark after line k (0-based) of a poem of ``lines`` lines: "，" after odd lines
    (1st, 3rd, ...), "。" after even ones and after the last line."""
    return "。" if k % 2 or k == lines - 1 else "，"


def poem_layout_ok(poem: str, form: int, lines: int = 4, acrostic: str = "") -> bool:
    """Whether ``poem`` is ``lines`` lines of ``form`` Han characters, each followed by its
    ``line_mark``, with no other character, and line k starting with ``acrostic[k]`` when an
    acrostic is given."""
    text = chars(poem)
    if len(text) != lines * (form + 1):
        return False
    rows = [text[k * (form + 1): (k + 1) * (form + 1)] for k in range(lines)]
    return (all(row[-1] == line_mark(k, lines) and all(map(is_han, row[:-1]))
                for k, row in enumerate(rows))
            and (not acrostic or "".join(row[0] for row in rows) == acrostic))


def distinct_n(hyps: Sequence[str], n: int) -> float:
    """Distinct-n, in its common per-n-gram form: the number of distinct character n-grams
    divided by the total number of character n-grams, over all hypotheses (n-grams do not
    cross lines; whitespace is dropped first, punctuation counts). Li et al. (2016) divide by
    the number of generated tokens instead; the two agree for n = 1, and for 7-character
    lines this distinct-2 is 7/6 of theirs. 0.0 when there is no n-gram."""
    if n < 1:
        raise XindaError(f"distinct-n needs n >= 1, got {n}")
    if not hyps:
        raise XindaError("no hypotheses to score (empty input)")
    grams = [text[i:i + n] for text in map(chars, hyps) for i in range(len(text) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def same_position_copy_rate(srcs: Sequence[str], hyps: Sequence[str]) -> float:
    """% of source characters copied to the same position of the hypothesis, which couplets
    forbid: over every position i < min(len(src), len(hyp)) where ``src[i]`` is not
    punctuation, the share with ``hyp[i] == src[i]``."""
    _check_pairs(srcs, hyps)
    positions = copies = 0
    for src, hyp in zip(map(chars, srcs), map(chars, hyps)):
        for s, h in zip(src, hyp):
            if not is_punctuation(s):
                positions += 1
                copies += s == h
    return _percent(copies, positions)
