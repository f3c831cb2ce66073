"""Streaming building blocks of ``xinda prepare``: aligned chunks of a parallel corpus, a
seeded reservoir sample, ``.npy`` files that grow chunk by chunk and an ordered, bounded
process-pool map. Memory holds a chunk (or a few in flight), never the corpus.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, Future
from concurrent.futures import TimeoutError as WaitTimedOut
from itertools import islice
from pathlib import Path
from typing import IO, TypeVar

import numpy as np

from xinda.errors import XindaError
from xinda.utils import interrupts_deferred, read_lines

T = TypeVar("T")
R = TypeVar("R")
Pair = tuple[list[str], list[str]]  # (src lines, tgt lines)
_READ_CHUNK = 50_000  # pairs per chunk where a caller keeps all of them anyway


def corpus_file(prefix: str, lang: str) -> Path:
    """``{prefix}.{lang}`` or ``{prefix}.{lang}.gz``, whichever is a file; both is a XindaError
    (the prefix could mean either, and their lines may differ)."""
    plain = Path(f"{prefix}.{lang}")
    gz = Path(f"{plain}.gz")
    if plain.is_file() and gz.is_file():
        raise XindaError(f"{plain}: {gz} exists too, and the corpus prefix {prefix} could mean "
                         "either: remove or rename one")
    for path in (plain, gz):
        if path.is_file():
            return path
    for path in (plain, gz):
        if path.is_dir():
            raise XindaError(f"{path}: is a directory, not a corpus file")
    raise XindaError(f"{plain}: file not found (nor {gz})")


def corpus_files(prefix: str, src_lang: str, tgt_lang: str) -> tuple[Path, Path]:
    return corpus_file(prefix, src_lang), corpus_file(prefix, tgt_lang)


def read_chunks(paths: Sequence[Path], size: int) -> Iterator[Pair]:
    """Aligned chunks of up to ``size`` pairs from the two sides of a parallel corpus.

    Raises XindaError naming the file (and line) on an empty side or on sides of different
    lengths, found when the shorter side ends.
    """
    readers = [read_lines(path) for path in paths]
    done = 0
    while True:
        chunk = (list(islice(readers[0], size)), list(islice(readers[1], size)))
        if not done:
            for path, lines in zip(paths, chunk):
                if not lines:
                    raise XindaError(f"{path}: empty corpus (no lines)")
        if len(chunk[0]) != len(chunk[1]):
            short, long_ = (0, 1) if len(chunk[0]) < len(chunk[1]) else (1, 0)
            n = done + len(chunk[short])
            raise XindaError(f"{paths[short]}:{n}: ends after {n} lines but {paths[long_]} "
                             "has more")
        if not chunk[0]:
            return
        done += len(chunk[0])
        yield chunk


def read_parallel(prefix: str, src_lang: str, tgt_lang: str) -> Pair:
    """Read both sides of a parallel corpus, checking they are non-empty and aligned."""
    src: list[str] = []
    tgt: list[str] = []
    for chunk_src, chunk_tgt in read_chunks(corpus_files(prefix, src_lang, tgt_lang),
                                            _READ_CHUNK):
        src += chunk_src
        tgt += chunk_tgt
    return src, tgt


class Reservoir:
    """A uniform sample of ``size`` items of a stream (algorithm R, seeded), in stream order.

    A stream of at most ``size`` items is kept whole: ``items()`` is then the stream itself.
    """

    def __init__(self, size: int, seed: int):
        self.size = size
        self.seen = 0
        self._rng = random.Random(seed)
        self._slots: list[tuple[int, object]] = []

    def add(self, item: object) -> None:
        if self.seen < self.size:
            self._slots.append((self.seen, item))
        elif self.size:
            j = self._rng.randrange(self.seen + 1)
            if j < self.size:
                self._slots[j] = (self.seen, item)
        self.seen += 1

    def items(self) -> list:
        return [item for _, item in sorted(self._slots, key=lambda slot: slot[0])]


class NpyAppender:
    """A 1-D ``.npy`` file written chunk by chunk: the header (shape) is rewritten at the end.

    The file is byte-identical to ``np.save`` of the concatenated chunks (format 1.0: a 1-D
    header is always padded to 128 bytes, whatever the length).
    """

    def __init__(self, file: IO[bytes], dtype: type):
        self.file = file
        self.dtype = np.dtype(dtype)
        self.count = 0
        self._header_size = self._write_header()

    def _write_header(self) -> int:
        start = self.file.tell()
        np.lib.format.write_array_header_1_0(self.file, {
            "descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False,
            "shape": (self.count,)})
        return self.file.tell() - start

    def append(self, values: np.ndarray) -> None:
        self.file.write(np.ascontiguousarray(values, dtype=self.dtype).tobytes())
        self.count += len(values)

    def finish(self) -> None:
        """Write the final shape into the header and flush."""
        end = self.file.tell()
        self.file.seek(0)
        if self._write_header() != self._header_size:
            raise RuntimeError("npy header size changed")  # cannot happen for 1-D arrays
        self.file.seek(end)
        self.file.flush()


def ordered_map(func: Callable[[T], R], items: Iterable[T], pool: Executor | None,
                ahead: int) -> Iterator[R]:
    """``map(func, items)`` in order, on ``pool`` when given with at most ``ahead`` items in
    flight (``Executor.map`` would read ``items`` to the end at once). Ctrl-C takes effect
    between the pool's calls, never inside them (``interrupts_deferred``)."""
    if pool is None:
        yield from map(func, items)
        return
    pending: deque[Future] = deque()
    for item in items:
        with interrupts_deferred():
            pending.append(pool.submit(func, item))
        if len(pending) >= ahead:
            yield result_of(pending.popleft())
    while pending:
        yield result_of(pending.popleft())


def result_of(future: Future, poll: float = 0.05) -> R:
    """``future.result()``, waited for in slices of ``poll`` seconds with Ctrl-C deferred
    within each: an interrupt ends the wait within ``poll`` and outside the executor's code."""
    while True:
        with interrupts_deferred():
            try:
                return future.result(timeout=poll)
            except WaitTimedOut:
                pass
