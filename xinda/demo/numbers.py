"""The built-in demo task: translate English number words into digits.

Generated locally and deterministically (no downloads), e.g.
``"four hundred twenty-one thousand seven" -> "421007"``.
"""

from __future__ import annotations

import random
from pathlib import Path

from xinda.utils import atomic_write_text

_ONES = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
    "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
    "eighteen", "nineteen",
)  # fmt: skip
_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_SCALES = ((1_000_000, "million"), (1_000, "thousand"))
DEMO_SPLITS = {"train": 20000, "valid": 300, "test": 300}  # pairs per split of `xinda demo`
DEMO_SEED = 1
MAX_VALUE = 999_999  # the demo's numbers: 0 .. MAX_VALUE


def _below_thousand(n: int) -> list[str]:
    """Words for 1 <= n < 1000 (American style: no "and", hyphenated tens)."""
    words = []
    hundreds, rest = divmod(n, 100)
    if hundreds:
        words += [_ONES[hundreds], "hundred"]
    if rest >= 20:
        tens, ones = divmod(rest, 10)
        words.append(_TENS[tens] + (f"-{_ONES[ones]}" if ones else ""))
    elif rest:
        words.append(_ONES[rest])
    return words


def number_to_words(n: int) -> str:
    """English words for 0 <= n < 1e9, e.g. 421007 -> "four hundred twenty-one thousand seven"."""
    if not 0 <= n < 1_000_000_000:
        raise ValueError(f"number_to_words supports 0 <= n < 1_000_000_000, got {n}")
    if n == 0:
        return "zero"
    words = []
    for value, name in _SCALES:
        count, n = divmod(n, value)
        if count:
            words += [*_below_thousand(count), name]
    if n:
        words += _below_thousand(n)
    return " ".join(words)


def make_pairs(n_pairs: int, seed: int, max_value: int = MAX_VALUE) -> list[tuple[str, str]]:
    """``n_pairs`` distinct random numbers as (words, digits) pairs, deterministic per seed.

    Magnitudes are mixed: the digit count is drawn uniformly from 1..len(str(max_value)) (among
    counts with unused numbers left), then a value with that many digits, up to ``max_value``.
    """
    if not 0 <= max_value < 1_000_000_000:
        raise ValueError(f"max_value must be in [0, 1e9), got {max_value}")
    if not 0 <= n_pairs <= max_value + 1:
        raise ValueError(f"cannot draw {n_pairs} distinct numbers from 0..{max_value}")
    rng = random.Random(seed)
    # digit count -> inclusive value range
    ranges = {
        d: (0 if d == 1 else 10 ** (d - 1), min(10**d - 1, max_value))
        for d in range(1, len(str(max_value)) + 1)
    }
    used: dict[int, int] = dict.fromkeys(ranges, 0)
    seen: set[int] = set()
    numbers: list[int] = []
    while len(numbers) < n_pairs:
        open_counts = [d for d, (lo, hi) in ranges.items() if used[d] < hi - lo + 1]
        d = rng.choice(open_counts)
        value = rng.randint(*ranges[d])
        if value not in seen:
            seen.add(value)
            used[d] += 1
            numbers.append(value)
    return [(number_to_words(v), str(v)) for v in numbers]


def write_demo_corpus(out_dir: str | Path, sizes: dict[str, int] = DEMO_SPLITS,
                      seed: int = DEMO_SEED, max_value: int = MAX_VALUE) -> dict[str, str]:
    """Write ``{split}.words`` and ``{split}.digits`` under ``out_dir`` for each split of
    ``sizes`` (split -> pairs; numbers disjoint across splits) and return the split prefixes,
    e.g. ``{"train": "out_dir/train", ...}``."""
    out_dir = Path(out_dir)
    pairs = make_pairs(sum(sizes.values()), seed, max_value)
    prefixes, start = {}, 0
    for name, size in sizes.items():
        split = pairs[start:start + size]
        start += size
        for side, suffix in enumerate(("words", "digits")):
            atomic_write_text(out_dir / f"{name}.{suffix}", "".join(f"{p[side]}\n" for p in split))
        prefixes[name] = str(out_dir / name)
    return prefixes
