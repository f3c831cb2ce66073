"""Small helpers shared by every stage: atomic writes and checked text reading."""

from __future__ import annotations

import codecs
import gzip
import itertools
import logging
import numbers
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from xinda.errors import XindaError

MAX_THREADS = 1024  # torch threads; more crash OpenMP ("Thread creation failed", segfaults)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it over ``path`` only on success (a link
    is written through, a stream, ``is_stream``, written to), with the old file's permissions
    or the umask's. Failures to write are ``XindaError`` naming ``path``."""
    path = Path(path)
    if path.is_dir():
        raise XindaError(f"{path}: is a directory, not a file")
    if is_stream(path):
        yield from _appended_to(path)
        return
    try:
        path = path.resolve(strict=False) if path.is_symlink() else path
    except RuntimeError:  # (Python 3.11's resolve of a link loop)
        raise XindaError(f"{path}: cannot write: a loop of symbolic links") from None
    with write_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
    try:
        try:
            yield Path(tmp)
        except OSError as err:  # disk full, file too large: the write of the temporary file
            raise _write_error(err, path, tmp) from None
        with write_errors(path):
            os.chmod(tmp, path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~_umask())
            os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


_STD_FD = re.compile(r"/dev/(?:fd/|std(?:(out)|err))(\d*)|/proc/self/fd/(\d+)")


def _appended_to(stream: Path) -> Iterator[Path]:
    """Yield a temporary file; on success write its bytes to ``stream``: to this process's
    own descriptor for /dev/stdout, /dev/stderr, /dev/fd/N (reopened, a file a shell opened
    with ``>`` is written at another offset than the shell's), else appended."""
    fd, tmp = tempfile.mkstemp(prefix=".xinda-", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        if (std := _STD_FD.fullmatch(stream.as_posix())) is not None:
            number = int(std[2] or std[3] or (1 if std[1] else 2))
            (sys.stdout if number == 1 else sys.stderr).flush()
        else:
            number = None
        with open(tmp, "rb") as written, (os.fdopen(os.dup(number), "ab") if number is not None
                                          else open(stream, "ab")) as out:
            shutil.copyfileobj(written, out)
    except OSError as err:  # /dev/full
        raise _write_error(err, stream, str(stream)) from None
    finally:
        Path(tmp).unlink(missing_ok=True)


def _write_error(err: OSError, path: Path, written: str) -> OSError | XindaError:
    """For ``err`` while writing ``written``: one line naming ``path`` (if not another file's)."""
    return err if err.filename not in (None, written) else XindaError(
        f"{path}: cannot write: {err.strerror or err}")


@contextmanager
def os_errors_named(path: str | Path, action: str = "") -> Iterator[None]:
    """An OSError (no permission, disk full...) as one line: ``path`` and ``action``, or the
    error's file (else ``path``) when no action is named."""
    try:
        yield
    except OSError as err:
        where, doing = (path, f"{action}: ") if action else (err.filename or path, "")
        on_file = isinstance(err, FileExistsError) and Path(err.filename or "").is_file()
        reason = f"{err.filename} is a file, not a folder" if on_file else err.strerror or err
        raise XindaError(f"{where}: {doing}{reason}") from None


def write_errors(path: str | Path):
    return os_errors_named(path, "cannot write")  # an OSError: "PATH: cannot write: ..."


def _umask() -> int:
    """The umask, from /proc where it can (setting it races the server's threads' files)."""
    try:
        status = Path("/proc/self/status").read_text()
        return int(re.search(r"^Umask:\s*([0-7]+)", status, re.MULTILINE).group(1), 8)
    except (OSError, AttributeError):
        mask = os.umask(0o022)
        os.umask(mask)
        return mask


def check_writable(path: str | Path, folder: bool = False, make: bool = True) -> None:
    """Fail early, before hours of work, where ``path`` (a file, or with ``folder`` a folder
    to write files into) cannot be written; makes missing parent folders, or with ``make``
    False checks the nearest one that exists (nothing is left behind by a later refusal)."""
    path = Path(path)
    if not folder and path.is_dir():
        raise XindaError(f"{path}: is a directory, not a file")
    stream = not folder and is_stream(path)  # written in place (atomic_path), not beside
    target = path if folder or stream else path.parent
    with write_errors(path):
        if make and not stream:
            target.mkdir(parents=True, exist_ok=True)
        target = next(p for p in (target, *target.parents) if p.exists() or p.is_symlink())
        if not (stream or target.is_dir()):
            raise NotADirectoryError(20, "not a directory")
        if not os.access(target, os.W_OK if stream else os.W_OK | os.X_OK):
            raise PermissionError(13, "permission denied")


def is_stream(path: Path) -> bool:
    """Whether ``path`` is written as a stream, never replaced: a pipe, a device, or a link
    under /dev or /proc (/dev/stdout; a regular file there, /dev/shm/file, is not)."""
    return (path.as_posix().startswith(("/dev/", "/proc/")) and path.is_symlink()) or (
        path.exists() and not path.is_file())


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def atomic_save(path: str | Path, save: Callable[[Path], None]) -> None:
    """Call ``save(tmp_path)`` and move the result over ``path`` atomically."""
    with atomic_path(path) as tmp:
        save(tmp)


# Unicode category Cc except tab (tab is whitespace, collapsed like a space)
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def has_control_chars(line: str) -> bool:
    """Whether ``line`` holds a control character (Unicode Cc) other than tab."""
    return _CONTROL.search(line) is not None


def replace_control_chars(line: str) -> str:
    """Replace each control character (Unicode Cc) other than tab by a space."""
    return _CONTROL.sub(" ", line)


# Unicode format characters (Cf) that only steer display: soft hyphen, Arabic letter mark,
# zero-width space, left-to-right/right-to-left marks, bidirectional embeddings and isolates,
# word joiner and invisible operators, byte-order mark. Zero-width (non-)joiners stay: they
# change how Persian, Indic scripts and emoji sequences read.
_INVISIBLE = re.compile("[\u00ad\u061c\u200b\u200e\u200f\u202a-\u202e\u2060-\u2064"
                        "\u2066-\u2069\ufeff]")


def drop_invisible_chars(line: str) -> str:
    """``line`` without the format characters that only steer display (a BOM, zero-width
    spaces, bidirectional marks, soft hyphens)."""
    return _INVISIBLE.sub("", line)


def visible_text(line: str) -> str:
    """What text cleaning leaves of ``line`` before normalisation: control characters to
    spaces, display-only format characters dropped, whitespace collapsed."""
    return " ".join(drop_invisible_chars(replace_control_chars(line)).split())


def open_text(path: str | Path) -> IO[bytes]:
    """Open plain or gzip-compressed text as bytes (decoded per line by ``read_lines``)."""
    path = Path(path)
    if path.is_dir():
        raise XindaError(f"{path}: is a directory, not a file")
    if not path.exists():  # not is_file(): /dev/stdin, pipes, <(...) are fine
        raise XindaError(f"{path}: file not found")
    try:
        return gzip.open(path, "rb") if _gzipped(path) else open(path, "rb")
    except OSError as err:
        raise XindaError(f"{path}: cannot open: {err.strerror or err}") from None


def _gzipped(path: Path) -> bool:
    """Whether to read ``path`` as gzip: named .gz (any case), or a file that starts as gzip
    does (bytes 1f 8b: never UTF-8 text). A pipe is not peeked at: only its name counts."""
    if path.suffix.lower() == ".gz" or not path.is_file():
        return path.suffix.lower() == ".gz"
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def input_name(path: str | Path | None) -> str:
    """How errors name an input: "<stdin>" for None, "-" or /dev/stdin, else the path."""
    return "<stdin>" if path is None or str(path) in ("-", "/dev/stdin") else str(path)


def read_input(path: str | Path | None) -> list[str]:
    """The lines of an input file, or of stdin for None or "-" (``input_name``)."""
    name = input_name(path)
    return list(decode_lines(sys.stdin.buffer, name) if name == "<stdin>" else read_lines(path))


def read_lines(path: str | Path) -> Iterator[str]:
    """Yield the lines of a UTF-8 text file (plain or gzip) without newlines. A XindaError
    names the file and 1-based line on invalid UTF-8, and the file, the cause and the last
    line read on a truncated, corrupt or non-gzip ``.gz`` file."""
    with open_text(path) as f:
        yield from decode_lines(f, str(path))


def _read_error(name: str, lines_read: int, err: Exception) -> str:
    """One line for an error while reading ``name`` after ``lines_read`` complete lines."""
    where = f"after line {lines_read}" if lines_read else "before the first line"
    if isinstance(err, EOFError):
        return f"{name}: truncated gzip file: the compressed data ends early ({where})"
    message = str(err)
    if isinstance(err, gzip.BadGzipFile) and message.startswith("Not a gzipped file"):
        if not lines_read:
            return f"{name}: not a gzip file (the name ends in .gz but the data is not gzip)"
        return f"{name}: corrupt gzip file: data after the compressed stream is not gzip ({where})"
    if isinstance(err, (gzip.BadGzipFile, zlib.error)):
        return f"{name}: corrupt gzip file: {message} ({where})"
    reason = err.strerror if isinstance(err, OSError) and err.strerror else message
    return f"{name}: read error: {reason} ({where})"


def looks_utf16(raw: bytes) -> bool:
    """Whether a line of 4+ bytes (its line break aside) has NUL at every even or every odd
    position, as UTF-16 of Latin text has."""
    raw = raw.rstrip(b"\r\n")
    return len(raw) >= 4 and (not raw[0::2].strip(b"\0") or not raw[1::2].strip(b"\0"))


def decode_lines(stream: IO[bytes], name: str) -> Iterator[str]:
    """Decode a binary line stream as UTF-8; ``name`` (a path or "<stdin>") goes in errors.

    A stream that fails while being read (truncated or corrupt gzip, I/O error) raises
    XindaError, never EOFError: the CLI framework would turn that into a bare "Aborted!".
    A UTF-8 byte-order mark at the start of the stream is dropped. The first line of 4 or more
    bytes (line 1, or a later one after shorter lines) with a NUL byte at every other position
    is an error: UTF-16 without a byte-order mark, which decodes as valid UTF-8 where it writes
    Latin letters. (A stray NUL elsewhere is a control character, cleaned or dropped like the
    others.)
    """
    lines, lineno, checked = iter(stream), 0, False
    while True:
        try:
            raw = next(lines)
        except StopIteration:
            return
        except (EOFError, OSError, zlib.error) as err:
            raise XindaError(_read_error(name, lineno, err)) from None
        lineno += 1
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            if lineno == 1 and raw[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE):
                raise XindaError(f"{name}: UTF-16 text (it starts with a UTF-16 byte-order "
                                 "mark); convert it to UTF-8, e.g. with iconv -f UTF-16 -t "
                                 "UTF-8") from None
            bad = raw[err.start:err.start + 1]
            raise XindaError(f"{name}:{lineno}: invalid UTF-8 (byte {err.start}: {bad!r})"
                             ) from None
        if not checked and len(raw.rstrip(b"\r\n")) >= 4:  # the first line long enough
            checked = True
            if looks_utf16(raw):
                raise XindaError(f"{name}:{lineno}: NUL bytes at every other position: UTF-16 "
                                 "text? (convert it to UTF-8, e.g. with iconv -f UTF-16LE -t "
                                 "UTF-8)")
        if lineno == 1:
            line = line.removeprefix("\ufeff")  # byte-order mark
            if b"\r" in raw.rstrip(b"\r\n"):
                lines = _unless_cr_only(lines, name)
        yield line.rstrip("\r\n")


def _unless_cr_only(lines: Iterator[bytes], name: str) -> Iterator[bytes]:
    """The ``lines`` after the first (which has a carriage return inside); a XindaError when
    it is the only line: CR-only (old Mac) line endings, whose sentences would run together."""
    try:
        second = next(lines)
    except StopIteration:
        raise XindaError(f"{name}: lines end in a carriage return only (CR, old Mac line "
                         "endings), read as one line: convert them, e.g. with tr '\\r' "
                         "'\\n'") from None
    except (EOFError, OSError, zlib.error) as err:
        raise XindaError(_read_error(name, 1, err)) from None
    return itertools.chain([second], lines)


def write_stdout(text: str) -> None:
    """Write ``text`` to standard output and flush it; a failed write (a full disk) is a
    one-line XindaError, a reader that stopped reading (``| head``) ends the command quietly
    with the shell's exit code for it, 141; nothing is flushed again at exit."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as err:
        sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - to the end
        if isinstance(err, BrokenPipeError):
            raise SystemExit(141) from None  # 128 + SIGPIPE, as shells report it
        raise XindaError(f"stdout: cannot write the output: {err.strerror or err}") from None


@contextmanager
def signal_handled(signum: int, handler) -> Iterator[None]:
    """``handler`` for ``signum`` in this block, the previous one restored after; a no-op
    outside the main thread (where Python cannot set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signum, handler)
    try:
        yield
    finally:
        signal.signal(signum, previous)


@contextmanager
def interrupts_deferred(signums: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)
                        ) -> Iterator[None]:
    """Signals that arrive in this block take effect when it ends, each with the handler it had
    before (Ctrl-C raises KeyboardInterrupt there). For code that must not stop half-way: a
    KeyboardInterrupt inside an executor's ``submit`` or ``result`` can leave one of its locks
    held, and its shutdown then waits forever. A no-op outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {s: signal.signal(s, lambda signum, _frame: arrived.append(signum))
                for s in signums}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(arrived):
            signal.raise_signal(signum)


def _interrupt(_signum, _frame):
    raise KeyboardInterrupt


def terminate_as_interrupt():
    """A block in which SIGTERM raises KeyboardInterrupt, so that what Ctrl-C cleans up
    (staging folders, temporary files) is cleaned up on ``kill`` or ``timeout``."""
    return signal_handled(signal.SIGTERM, _interrupt)


class _WarningsNamed(logging.Formatter):
    """Messages as they are, warnings as ``xinda: warning: ...`` (as errors are written)."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return f"xinda: warning: {text}" if record.levelno == logging.WARNING else text


def log_to_stderr() -> None:
    """The command line's logging: information and warnings on stderr, warnings named."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_WarningsNamed("%(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])


def is_whole(value: object) -> bool:  # an integer (numpy's too), not a bool
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_lines(lines, name: str = "lines") -> list[str]:
    """``lines`` (any iterable of str) as a list; one string, or an item that is not one, is
    a XindaError (before: a string was translated character by character)."""
    if isinstance(lines, (str, bytes)) or not hasattr(lines, "__iter__"):
        hint = " (wrap one text in a list: [text])" if isinstance(lines, str) else ""
        raise XindaError(f"{name}: expected a list of strings, got {type(lines).__name__}{hint}")
    lines = list(lines)
    for i, line in enumerate(lines, start=1):
        if not isinstance(line, str):
            raise XindaError(f"{name}: item {i} is {type(line).__name__}, not str")
    return lines
