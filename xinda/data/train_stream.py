"""The training split of ``xinda prepare``, streamed chunk by chunk in two passes.

Pass 1 (``spool_train``) reads aligned chunks of ``data.chunk_size`` pairs, preprocesses them
(control-character mask, normalisation, pre-tokenisation, deduplication keys) and appends each
to a spool file in the output directory, keeping a seeded reservoir sample of
``data.spm_sample`` pairs for sentencepiece (every pair, in order, when the corpus is smaller;
with ``data.dedup`` only the first of identical pairs, as pass 2 keeps).
Pass 2 (``binarise_train``) encodes the spooled chunks with the trained model, truncates or
filters them and appends them to the ``.npy`` arrays. Memory holds the sample, a few chunks and
the deduplication digests (``xinda.data.filtering``), never the corpus. With ``data.workers``
above 1, chunks are preprocessed and encoded by a process pool, in order: the output does not
depend on the number of workers.
"""

from __future__ import annotations

import multiprocessing
import pickle
import signal
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import lru_cache, partial
from pathlib import Path

import numpy as np
import sentencepiece as spm

from xinda.config import DataConfig
from xinda.data.arrays import TokenArrays
from xinda.data.filtering import (
    DROPPED_FILE,
    FILTERS,
    check_not_all_filtered,
    dropped_rows,
    filter_chunk,
    pair_keys,
    report,
)
from xinda.data.manifest import SIDES
from xinda.data.stream import NpyAppender, Pair, Reservoir, ordered_map, read_chunks
from xinda.data.text import TextPipeline
from xinda.data.vocab import Vocab
from xinda.errors import XindaError
from xinda.utils import atomic_path, has_control_chars, interrupts_deferred, signal_handled

_ENCODE_BATCH = 20_000


def encode_lines(sp: spm.SentencePieceProcessor, lines: Sequence[str]) -> TokenArrays:
    """Encode pre-tokenised lines in batches (no BOS/EOS)."""
    parts = [
        TokenArrays.from_sequences(sp.encode(list(lines[i:i + _ENCODE_BATCH]), out_type=int))
        for i in range(0, len(lines), _ENCODE_BATCH)
    ]
    return TokenArrays.concat(parts)


def control_mask(pair: Pair) -> np.ndarray:
    """True for each pair with a control character (Cc other than tab) on either side."""
    return np.array([has_control_chars(s) or has_control_chars(t) for s, t in zip(*pair)],
                    dtype=bool)


@dataclass
class Chunk:
    """Preprocessed training pairs; those with a control character are emptied."""

    text: Pair
    control: np.ndarray
    keys: list[bytes] | None  # deduplication keys of the cleaned pairs (with data.dedup)


def preprocess_chunk(pipes: tuple[TextPipeline, TextPipeline], dedup: bool, raw: Pair) -> Chunk:
    control = control_mask(raw)
    src, tgt = (["" if c else pipe.preprocess(x) for x, c in zip(lines, control)]
                for pipe, lines in zip(pipes, raw))
    # keyed once cleaned: "难以置信！" and "难以置信!" are one pair after NFKC (before: two)
    return Chunk((src, tgt), control, pair_keys((src, tgt)) if dedup else None)


@dataclass
class Spool:
    """Pass 1's result: where the chunks are, their counts and the sentencepiece sample."""

    path: Path
    offsets: list[int] = field(default_factory=list)  # byte offset of each pickled chunk
    pairs: int = 0
    control: int = 0
    usable: int = 0  # pairs with two non-empty sides and no control character
    sample: Pair = field(default_factory=lambda: ([], []))


@contextmanager
def worker_pool(workers: int) -> Iterator[Executor | None]:
    """A pool of ``workers`` processes, or None for one. They are spawned (safe beside
    threads), so a script that calls ``prepare`` with workers needs the usual
    ``if __name__ == "__main__":`` guard. A worker that dies (killed, out of memory) ends
    ``prepare`` with an error; before, with ``multiprocessing.Pool``, it waited forever for
    the lost chunk."""
    if workers <= 1:
        yield None
        return
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    try:
        # start every worker now, in a block where Ctrl-C is ignored: they inherit that.
        # Ctrl-C reaches a terminal's whole process group, but it is the parent's to handle:
        # a worker that took it would die, with a traceback, and break the pool
        with interrupts_deferred(), signal_handled(signal.SIGINT, signal.SIG_IGN):
            for started in [pool.submit(int) for _ in range(workers)]:  # (one spawn each)
                started.result()
        yield pool
    except BrokenProcessPool:
        raise XindaError(f"a data.workers process died (killed, or out of memory?): run "
                         f"prepare again, with fewer than {workers} workers or a smaller "
                         "data.chunk_size (from a Python script: call prepare under "
                         "`if __name__ == \"__main__\":`, which spawned workers need)") from None
    finally:
        with interrupts_deferred():  # (a second Ctrl-C must not stop it half-way either)
            pool.shutdown(wait=True, cancel_futures=True)


def spool_train(files: Sequence[Path], cfg: DataConfig, pipes: tuple[TextPipeline, TextPipeline],
                pool: Executor | None, path: Path) -> Spool:
    """Pass 1: read and preprocess every chunk into ``path``; sample pairs for sentencepiece
    (unless ``data.spm_model`` gives one). Fails (before anything is trained) if no pair has
    two non-empty sides."""
    sample_size = 0 if cfg.spm_model else cfg.spm_sample  # a given model needs no sample
    spool, reservoir = Spool(path), Reservoir(sample_size, cfg.seed)
    seen: set[bytes] | None = set() if cfg.dedup and sample_size else None  # keys sampled
    work = partial(preprocess_chunk, pipes, cfg.dedup)
    with open(path, "wb") as f:
        for chunk in ordered_map(work, read_chunks(files, cfg.chunk_size), pool, 2 * cfg.workers):
            spool.offsets.append(f.tell())
            pickle.dump(chunk, f, protocol=pickle.HIGHEST_PROTOCOL)
            spool.pairs += len(chunk.control)
            spool.control += int(chunk.control.sum())
            for i, (s, t) in enumerate(zip(*chunk.text)):
                if s and t:  # a pair with an empty side is dropped: no sample slot for it
                    spool.usable += 1
                    if seen is not None:  # a repeat, dropped in pass 2: no sample slot either
                        if chunk.keys[i] in seen:
                            continue
                        seen.add(chunk.keys[i])
                    reservoir.add((s, t))
    sample = reservoir.items()
    spool.sample = ([s for s, _ in sample], [t for _, t in sample])
    if not spool.usable:
        n, n_control = spool.pairs, spool.control
        dropped = dict.fromkeys(FILTERS, 0) | {"empty": n - n_control, "control_chars": n_control}
        check_not_all_filtered(cfg.train, report(n, dropped))
    return spool


@lru_cache(maxsize=2)
def _cached_processor(model: str, stamp: tuple[int, int, int]) -> spm.SentencePieceProcessor:
    return Vocab(model).sp


def _processor(model: str) -> spm.SentencePieceProcessor:
    """The model at ``model``, loaded once per process and again when the file changes."""
    st = Path(model).stat()
    return _cached_processor(model, (st.st_ino, st.st_mtime_ns, st.st_size))


def encode_chunk(models: tuple[str, str], spool: str, offset: int
                 ) -> tuple[TokenArrays, TokenArrays, np.ndarray, list[bytes] | None]:
    """Pass 2's work on one chunk: its pieces ids per side, control mask and keys."""
    with open(spool, "rb") as f:
        f.seek(offset)
        chunk: Chunk = pickle.load(f)
    src, tgt = (encode_lines(_processor(m), lines) for m, lines in zip(models, chunk.text))
    return src, tgt, chunk.control, chunk.keys


@contextmanager
def array_writers(out_dir: Path, split: str) -> Iterator[Callable[[str, TokenArrays], None]]:
    """``append(side, arrays)`` onto ``{split}.{side}.{ids,offsets}.npy``; the files appear
    (atomically) only when the block ends without an error."""
    with ExitStack() as stack:
        files = {}
        for side in SIDES:
            for kind, dtype in (("ids", np.int32), ("offsets", np.int64)):
                tmp = stack.enter_context(atomic_path(out_dir / f"{split}.{side}.{kind}.npy"))
                files[side, kind] = NpyAppender(stack.enter_context(open(tmp, "wb")), dtype)
            files[side, "offsets"].append(np.zeros(1, dtype=np.int64))

        def append(side: str, arrays: TokenArrays) -> None:
            ids = files[side, "ids"]
            files[side, "offsets"].append(arrays.offsets[1:] + ids.count)
            ids.append(arrays.ids)

        yield append
        for writer in files.values():
            writer.finish()


def binarise_train(spool: Spool, models: tuple[str, str], cfg: DataConfig, out_dir: Path,
                   pool: Executor | None) -> tuple[dict, dict]:
    """Pass 2: encode, truncate or filter and write the training arrays; return the split's
    stats and the filter report."""
    seen: set[bytes] = set()
    dropped, cut, tokens = dict.fromkeys(FILTERS, 0), {"src": 0, "tgt": 0}, {"src": 0, "tgt": 0}
    work, line = partial(encode_chunk, models, str(spool.path)), 1
    with array_writers(out_dir, "train") as append, \
            open(out_dir / DROPPED_FILE, "w", encoding="utf-8") as listed:
        listed.write("line\tfilter\n")
        for src, tgt, control, keys in ordered_map(work, spool.offsets, pool, 2 * cfg.workers):
            long = {"src": src.lengths > cfg.max_len, "tgt": tgt.lengths > cfg.max_len}
            if cfg.long_pairs == "truncate":
                src, tgt = src.truncate(cfg.max_len)[0], tgt.truncate(cfg.max_len)[0]
            keep, masks = filter_chunk(keys, src, tgt, cfg, control, seen)
            listed.write(dropped_rows(masks, line))
            line += len(keep)
            for side in SIDES:  # the kept pairs that were cut
                cut[side] += int((long[side] & keep).sum())
            for name, mask in masks.items():
                dropped[name] += int(mask.sum())
            for side, arrays in zip(SIDES, (src.select(keep), tgt.select(keep))):
                append(side, arrays)
                tokens[side] += int(arrays.ids.size)
        filter_report = report(spool.pairs, dropped)
        check_not_all_filtered(cfg.train, filter_report)
    stats = {"pairs": filter_report["kept"], "src_tokens": tokens["src"],
             "tgt_tokens": tokens["tgt"]}
    if cfg.long_pairs == "truncate":
        filter_report["truncated"], stats["truncated"] = cut, dict(cut)
    return stats, filter_report
