"""A warning before the metrics whose time and memory grow with the square of a line's length,
when a line is long enough for that to show: sacreBLEU's TER (edit distance with shifts) and
rouge-score's ROUGE-L (a longest-common-subsequence table), neither of which offers a limit.

Measured on one line pair (2 CPU cores): TER 2-3 s at 500 words, 15-40 s at 1,000, over 5
minutes and 700 MB at 5,000; ROUGE 1 s at 2,000 words, 9 s and 423 MB at 5,000. BLEU and chrF
grow linearly (under 2 s at 5,000 words)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

log = logging.getLogger("xinda")
# metric -> (its name in the warning, the tokens of a line beyond which it warns)
SLOW_METRICS = {"ter": ("TER", 500), "rouge": ("ROUGE", 2000)}


def line_tokens(line: str, chars: bool) -> int:
    """A line's length as the metric counts it: non-space characters or whitespace words."""
    return sum(not ch.isspace() for ch in line) if chars else len(line.split())


def warn_long_lines(metric: str, streams: Sequence[Sequence[str]], names: Sequence[str],
                    chars: bool = False) -> None:
    """Warn (one line) when a line of ``streams`` (hypotheses, then each reference stream,
    named by ``names``) is longer than ``metric``'s bound in ``SLOW_METRICS``: its longest
    line, how many are over the bound, and how to score without the metric."""
    if metric not in SLOW_METRICS:
        return
    label, bound = SLOW_METRICS[metric]
    longest, where, over = 0, ("", 0), 0
    for name, lines in zip(names, streams):
        for number, line in enumerate(lines, 1):
            if (size := line_tokens(line, chars)) > bound:
                over += 1
                if size > longest:
                    longest, where = size, (name, number)
    if not over:
        return
    unit = "characters" if chars else "words"
    more = f" ({over - 1:,} more line{'s' * (over > 2)} over {bound:,})" if over > 1 else ""
    log.warning("%s line %d: %s %s%s: %s takes time and memory growing with the square of a "
                "line's length (minutes for thousands of %s); --metrics bleu,chrf scores "
                "without it", *where, f"{longest:,}", unit, more, label, unit)
