"""Small helpers shared by every stage: atomic writes and checked text reading."""

from __future__ import annotations

import gzip
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from xinda.errors import XindaError


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it over ``path`` only on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def atomic_save(path: str | Path, save: Callable[[Path], None]) -> None:
    """Call ``save(tmp_path)`` and move the result over ``path`` atomically."""
    with atomic_path(path) as tmp:
        save(tmp)


def open_text(path: str | Path) -> IO[bytes]:
    """Open plain or gzip-compressed text as bytes (decoded per line by ``read_lines``)."""
    path = Path(path)
    if not path.exists() or path.is_dir():  # not is_file(): /dev/stdin, pipes, <(...) are fine
        raise XindaError(f"{path}: file not found")
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def read_lines(path: str | Path) -> Iterator[str]:
    """Yield the lines of a UTF-8 text file (plain or .gz) without newlines.

    Raises XindaError naming the file and 1-based line on invalid UTF-8.
    """
    with open_text(path) as f:
        yield from decode_lines(f, str(path))


def decode_lines(stream: IO[bytes], name: str) -> Iterator[str]:
    """Decode a binary line stream as UTF-8; ``name`` (a path or "<stdin>") goes in errors."""
    for lineno, raw in enumerate(stream, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            bad = raw[err.start:err.start + 1]
            raise XindaError(f"{name}:{lineno}: invalid UTF-8 (byte {err.start}: {bad!r})"
                             ) from None
        yield line.rstrip("\r\n")
