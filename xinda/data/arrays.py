"""Binarised corpora: variable-length id sequences as two flat, memory-mappable numpy arrays.

``{stem}.ids.npy`` (int32) holds every sentence's ids concatenated; ``{stem}.offsets.npy``
(int64) holds n + 1 offsets, so sentence i is ``ids[offsets[i]:offsets[i + 1]]``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import chain
from pathlib import Path
from zipfile import BadZipFile

import numpy as np

from xinda.errors import XindaError
from xinda.utils import atomic_path


class TokenArrays:
    """A list of variable-length id sequences stored as flat ``ids`` plus ``offsets``."""

    def __init__(self, ids: np.ndarray, offsets: np.ndarray):
        self.ids = ids
        self.offsets = offsets
        self._lengths: np.ndarray | None = None

    @classmethod
    def from_sequences(cls, seqs: Sequence[Sequence[int]]) -> TokenArrays:
        lengths = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
        offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        ids = np.fromiter(chain.from_iterable(seqs), dtype=np.int32, count=int(offsets[-1]))
        return cls(ids, offsets)

    @classmethod
    def concat(cls, parts: Sequence[TokenArrays]) -> TokenArrays:
        if not parts:
            return cls.from_sequences([])
        ids = np.concatenate([p.ids for p in parts])
        lengths = np.concatenate([p.lengths for p in parts])
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(ids.astype(np.int32, copy=False), offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"sentence index {i} out of range for {n} sentences")
        i %= n
        return self.ids[self.offsets[i]:self.offsets[i + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[i] for i in range(len(self)))

    @property
    def lengths(self) -> np.ndarray:
        """Token count of every sentence (int64)."""
        if self._lengths is None:
            self._lengths = np.diff(self.offsets)
        return self._lengths

    def select(self, keep: np.ndarray) -> TokenArrays:
        """The sentences where the boolean mask ``keep`` is true, in order."""
        ids = self.ids[np.repeat(keep, self.lengths)]
        offsets = np.zeros(int(keep.sum()) + 1, dtype=np.int64)
        np.cumsum(self.lengths[keep], out=offsets[1:])
        return TokenArrays(ids, offsets)

    def truncate(self, limit: int) -> tuple[TokenArrays, int]:
        """Every sentence cut to its first ``limit`` ids, and how many were cut."""
        lengths = self.lengths
        kept = np.minimum(lengths, limit)
        starts = self.offsets[:-1]
        within = np.arange(int(kept.sum())) - np.repeat(np.cumsum(kept) - kept, kept)
        ids = self.ids[np.repeat(starts, kept) + within]
        offsets = np.zeros(len(self) + 1, dtype=np.int64)
        np.cumsum(kept, out=offsets[1:])
        return TokenArrays(ids, offsets), int((lengths > limit).sum())

    def save(self, directory: Path, stem: str) -> None:
        _save_npy(directory / f"{stem}.ids.npy", self.ids.astype(np.int32, copy=False))
        _save_npy(directory / f"{stem}.offsets.npy", self.offsets.astype(np.int64, copy=False))

    @classmethod
    def load(cls, directory: Path, stem: str) -> TokenArrays:
        """Memory-mapped (read-only) arrays written by ``save``, checked to fit together (in
        one pass over the offsets; the ids are not read)."""
        ids_path, offsets_path = directory / f"{stem}.ids.npy", directory / f"{stem}.offsets.npy"
        ids, offsets = _load_npy(ids_path), _load_npy(offsets_path)
        _check_ids(ids_path, ids)
        arrays = cls(ids, offsets)
        arrays._lengths = _check_offsets(offsets_path, offsets, ids_path.name, len(ids))
        return arrays


def _save_npy(path: Path, array: np.ndarray) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as f:  # a handle: np.save adds no suffix
        np.save(f, array)


def _stale(path: Path, what: str) -> XindaError:
    return XindaError(f"{path}: {what}; re-run xinda prepare")


def _load_npy(path: Path) -> np.ndarray:
    """A memory-mapped 1-D array, or an error naming ``path``."""
    try:
        array = np.load(path, mmap_mode="r")
    except FileNotFoundError:
        raise _stale(path, "not found") from None
    except OSError as err:  # a directory, no permission, ...
        raise _stale(path, f"cannot read ({err.strerror or err})") from None
    except (ValueError, EOFError, BadZipFile):  # a truncated or foreign file
        raise _stale(path, "damaged or truncated, not a readable .npy array") from None
    if not isinstance(array, np.ndarray):  # an .npz archive
        array.close()
        raise _stale(path, "damaged or truncated, not a readable .npy array")
    if array.ndim != 1:
        raise _stale(path, f"a {array.ndim}-D array, not 1-D")
    return array


def _check_ids(path: Path, ids: np.ndarray) -> None:
    if not np.issubdtype(ids.dtype, np.integer):
        raise _stale(path, f"ids of type {ids.dtype}, not integers")


def _check_offsets(path: Path, offsets: np.ndarray, ids_name: str, n_ids: int) -> np.ndarray:
    """The sentence lengths of ``offsets``, checked against the ``n_ids`` ids of ``ids_name``."""
    if offsets.dtype != np.int64:
        raise _stale(path, f"offsets of type {offsets.dtype}, not int64")
    if not len(offsets):
        raise _stale(path, "no offsets (not even the initial 0)")
    if offsets[0] != 0:
        raise _stale(path, f"the offsets start at {int(offsets[0])}, not 0")
    lengths = np.diff(offsets)
    if (lengths < 0).any():
        i = int(np.argmax(lengths < 0))
        raise _stale(path, f"the offsets decrease: sentence {i} would run from "
                           f"{int(offsets[i])} back to {int(offsets[i + 1])}")
    if offsets[-1] != n_ids:
        raise _stale(path, f"the offsets end at {int(offsets[-1])}, but {ids_name} has "
                           f"{n_ids} ids")
    return lengths
