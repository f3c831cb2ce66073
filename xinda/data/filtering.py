"""Filtering of training pairs (``xinda prepare``) and its report.

A pair is dropped, and counted under the first check it fails, for: a control character on
either side, an empty side, a side longer than ``data.max_len`` pieces, a length ratio over
``data.max_len_ratio`` (for pairs whose longer side has more than ``data.ratio_min_len``
pieces), or (``data.dedup``) being an exact repeat of an earlier kept pair.

Deduplication is exact over the whole corpus, chunk after chunk, with bounded memory per pair:
it keeps a set of 16-byte BLAKE2b digests of the pairs as cleaned and pre-tokenised (two
lines that normalise alike are one pair), not the text. That set is the one
part of ``prepare`` that grows with the corpus: about 100 bytes per distinct kept pair (measured;
a 49-byte ``bytes`` object, its set slot and allocator overhead), so 100 million distinct pairs
need ~10 GB; turn ``data.dedup`` off for larger corpora, or deduplicate them beforehand. (A
digest collision, which would drop a pair wrongly, has a chance of about n^2 / 2^129.)
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from xinda.config import DataConfig
from xinda.data.arrays import TokenArrays
from xinda.errors import XindaError

Pair = tuple[list[str], list[str]]  # (src lines, tgt lines)
FILTERS = ("empty", "too_long", "length_ratio", "duplicate", "control_chars")
DROPPED_FILE = "filtered-train.tsv"  # in the prepared folder: each dropped pair's line, reason


def pair_keys(pairs: Pair) -> list[bytes]:
    """The deduplication key of each pair: a 16-byte digest of both sides."""
    return [hashlib.blake2b(f"{s}\n{t}".encode(), digest_size=16).digest()
            for s, t in zip(*pairs)]  # no line holds "\n": the split between sides is exact


def _first_occurrences(keys: Sequence[bytes], candidates: np.ndarray,
                       seen: set[bytes]) -> np.ndarray:
    """Mask of candidate pairs whose key is not in ``seen`` nor an earlier candidate's; the
    candidates' keys are added to ``seen``."""
    first = np.zeros_like(candidates)
    for i in np.flatnonzero(candidates):
        if keys[i] not in seen:
            seen.add(keys[i])
            first[i] = True
    return first


def filter_chunk(keys: Sequence[bytes] | None, src: TokenArrays, tgt: TokenArrays,
                 cfg: DataConfig, control: np.ndarray, seen: set[bytes]
                 ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Keep-mask of one chunk and, per filter, the mask of the pairs it dropped; ``seen``
    carries deduplication across chunks (``keys`` is needed only with ``data.dedup``)."""
    ls, lt = src.lengths, tgt.lengths
    empty = ~control & ((ls == 0) | (lt == 0))
    too_long = ~control & ~empty & ((ls > cfg.max_len) | (lt > cfg.max_len))
    ok = ~control & ~empty & ~too_long
    longer = np.maximum(ls, lt)
    ratio = longer / np.maximum(np.minimum(ls, lt), 1)
    bad_ratio = ok & (ratio > cfg.max_len_ratio) & (longer > cfg.ratio_min_len)
    keep = ok & ~bad_ratio
    duplicate = np.zeros_like(keep)
    if cfg.dedup:
        duplicate = keep & ~_first_occurrences(keys, keep, seen)
        keep &= ~duplicate
    return keep, {"empty": empty, "too_long": too_long, "length_ratio": bad_ratio,
                  "duplicate": duplicate, "control_chars": control}


def dropped_rows(masks: dict[str, np.ndarray], first_line: int) -> str:
    """TSV rows "line<TAB>filter" of the pairs the ``masks`` drop, in line order; the chunk's
    first pair is line ``first_line``."""
    rows = sorted((int(i) + first_line, name) for name, mask in masks.items()
                  for i in np.flatnonzero(mask))
    return "".join(f"{line}\t{name}\n" for line, name in rows)


def filter_train(text: Pair, src: TokenArrays, tgt: TokenArrays, cfg: DataConfig,
                 control: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
    """Keep-mask and report of a whole (in-memory) corpus, ``text`` its lines as cleaned and
    pre-tokenised (the deduplication keys); each dropped pair is counted under its first
    failed check (``control``, the pairs with control characters, first)."""
    if control is None:
        control = np.zeros(len(src), dtype=bool)
    keys = pair_keys(text) if cfg.dedup else None
    keep, masks = filter_chunk(keys, src, tgt, cfg, control, set())
    return keep, report(len(src), {name: int(mask.sum()) for name, mask in masks.items()})


def report(read: int, dropped: dict[str, int]) -> dict:
    return {"read": read, "kept": read - sum(dropped.values()), "dropped": dropped}


def dropped_counts(report: dict) -> str:
    d = report["dropped"]
    return (f"empty {d['empty']}, too long {d['too_long']}, length ratio {d['length_ratio']}, "
            f"duplicate {d['duplicate']}, control characters {d['control_chars']}")


def truncated_note(counts: dict | None) -> str:
    return (f"; cut to data.max_len: {counts['src']} sources, {counts['tgt']} targets"
            if counts else "")


def format_report(split: str, report: dict) -> str:
    listed = f" (their lines: {DROPPED_FILE})" if report["kept"] < report["read"] else ""
    return (f"{split}: read {report['read']} pairs, kept {report['kept']}; dropped: "
            f"{dropped_counts(report)}{listed}{truncated_note(report.get('truncated'))}")


def check_not_all_filtered(prefix: str, report: dict) -> None:
    if report["kept"] == 0:
        raise XindaError(
            f"{prefix}: all {report['read']} training pairs were removed by filtering "
            f"({dropped_counts(report)}; see data.max_len, data.max_len_ratio, data.ratio_min_len)"
        )


HEAVY_DROP = 0.05  # length filters dropping more of the training pairs than this: a warning
FEW_PIECES = 3.0  # pieces per kept line below which a side reads as whole sentences as pieces


def heavy_drop_warning(report: dict, stats: dict) -> str | None:
    """A warning when the length filters dropped over ``HEAVY_DROP`` of the training pairs;
    it names a side whose kept lines average under ``FEW_PIECES`` pieces: with pretok none,
    sentencepiece fills a large vocabulary with whole sentences of an unspaced language (5000
    Tatoeba zh-en pairs at vocab_size 32000: 63 % dropped, 2.4 Chinese pieces per line)."""
    dropped = report["dropped"]["length_ratio"] + report["dropped"]["too_long"]
    if dropped <= HEAVY_DROP * report["read"]:
        return None
    per_line = {side: stats[f"{side}_tokens"] / max(stats["pairs"], 1) for side in ("src", "tgt")}
    few = [f"{side} ({n:.1f} pieces per kept line)" for side, n in per_line.items()
           if n < FEW_PIECES]
    why = (f": its {' and '.join(few)} looks like whole sentences made pieces; pre-tokenise "
           "that side (data.pretok_src / pretok_tgt: jieba or char for Chinese) or lower "
           "data.vocab_size" if few else
           ": see data.max_len, data.max_len_ratio and data.ratio_min_len")
    return (f"warning: the length filters dropped {dropped} of {report['read']} training pairs "
            f"({dropped / max(report['read'], 1):.0%}){why}")
