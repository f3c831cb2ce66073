"""An exclusive lock on a file while a block runs (``xinda prepare``'s on its output folder)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from xinda.errors import XindaError
from xinda.utils import write_errors


@contextmanager
def locked(path: Path, held: str) -> Iterator[None]:
    """An exclusive lock on the file ``path`` while in the block (the file is made, and
    removed after); a XindaError ``held`` (``{path}`` filled in) if another process holds it."""
    with _lock_file(path, held):
        try:
            yield
        finally:
            path.unlink(missing_ok=True)


def _lock_file(path: Path, held: str) -> IO[str]:
    """The file at ``path``, opened and locked. One whose holder removed it between our open
    and lock is not the file at ``path`` any more: the new one is locked instead (else two
    processes could each hold a lock, one on the removed file)."""
    while True:
        with write_errors(path):
            handle = open(path, "a")  # noqa: SIM115 - the caller closes it
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise XindaError(held.format(path=path)) from None
        if _same_file(handle, path):
            return handle
        handle.close()


def _same_file(handle: IO[str], path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(handle.fileno()), os.stat(path))
    except FileNotFoundError:
        return False
