"""``xinda.utils.atomic_path``: whole files or none, written where the user pointed, with
one-line errors naming the path."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from xinda.errors import XindaError
from xinda.utils import atomic_write_text, check_writable


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old\n")
    from xinda.utils import atomic_path

    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError
    assert target.read_text() == "old\n" and os.listdir(tmp_path) == ["out.txt"]


def test_a_full_disk_while_writing_names_the_file_and_keeps_the_old_one(tmp_path):
    """Before: the write itself was outside the error naming, so a full disk (or a file-size
    limit) printed "xinda: error: File too large" with no file (found by review)."""
    from xinda.utils import atomic_path

    target = tmp_path / "out.txt"
    target.write_text("old\n")
    with pytest.raises(XindaError) as err, atomic_path(target) as tmp:
        tmp.write_text("half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as numpy's and write()'s
    assert str(err.value) == f"{target}: cannot write: No space left on device"
    assert target.read_text() == "old\n" and os.listdir(tmp_path) == ["out.txt"]
    with pytest.raises(FileNotFoundError), atomic_path(target):  # another file's error
        (tmp_path / "missing.txt").read_text()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")
def test_a_full_device_is_named():
    """Before: a device is written in place, outside the error naming: -o /dev/full printed
    "xinda: error: No space left on device" with no file (found by review)."""
    with pytest.raises(XindaError) as err:
        atomic_write_text("/dev/full", "text\n" * 10_000)
    assert str(err.value) == "/dev/full: cannot write: No space left on device"


def test_dev_stdout_to_a_pipe_is_written_in_place():
    """Before: the link /dev/stdout was resolved to /proc/PID/fd/pipe:[N], no such file (found
    by review: translate -o /dev/stdout | ... failed)."""
    code = "from xinda.utils import atomic_write_text; atomic_write_text('/dev/stdout', 'hi\\n')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "hi\n", "")


@pytest.mark.parametrize("redirect", [">", ">>"])
def test_dev_stdout_to_a_file_keeps_what_the_shell_wrote_before(tmp_path, redirect):
    """Before: /dev/stdout, a link to the file the shell opened, was followed and the file
    replaced: an appended log lost its earlier lines, and what the shell wrote after went to
    the old, unlinked file (found by review)."""
    log = tmp_path / "log.txt"
    log.write_text("earlier\n")
    code = "from xinda.utils import atomic_write_text; atomic_write_text('/dev/stdout', 'hi\\n')"
    script = f'{{ echo before; {sys.executable} -c "{code}"; echo after; }} {redirect} {log}'
    subprocess.run(["bash", "-c", script], check=True)
    kept = "earlier\n" if redirect == ">>" else ""
    assert log.read_text() == f"{kept}before\nhi\nafter\n"


def test_a_file_under_dev_shm_is_replaced_as_any_file(tmp_path):
    """Only streams are appended to; a regular file under /dev (tmpfs) is replaced."""
    if not os.access("/dev/shm", os.W_OK):
        pytest.skip("no writable /dev/shm here")
    with tempfile.NamedTemporaryFile("w", dir="/dev/shm", suffix=".txt", delete=False) as f:
        f.write("old text\n")
    try:
        atomic_write_text(f.name, "new\n")
        assert Path(f.name).read_text() == "new\n"
    finally:
        os.unlink(f.name)


def test_a_new_file_gets_the_umasks_permissions_and_an_old_file_keeps_its_own(tmp_path):
    old = os.umask(0o027)
    try:
        atomic_write_text(tmp_path / "new.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new.txt").stat().st_mode) == 0o640
    kept = tmp_path / "kept.txt"
    kept.write_text("x")
    kept.chmod(0o604)
    atomic_write_text(kept, "y")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o604 and kept.read_text() == "y"


def test_a_symbolic_link_is_written_through(tmp_path):
    real = tmp_path / "real.txt"
    real.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    atomic_write_text(link, "new")
    assert link.is_symlink() and real.read_text() == "new"


def test_a_fifo_is_written_in_place(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        atomic_write_text(fifo, "through the pipe\n")
        assert os.read(reader, 100) == b"through the pipe\n"
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(fifo.stat().st_mode)


@pytest.mark.parametrize("where", ["directory", "under a file"])
def test_unwritable_paths_are_one_line_errors_naming_them(tmp_path, where):
    (tmp_path / "file").write_text("x")
    path = tmp_path if where == "directory" else tmp_path / "file" / "out.txt"
    for write in (lambda: atomic_write_text(path, "y"), lambda: check_writable(path)):
        with pytest.raises(XindaError, match=f"^{path}: ") as info:
            write()
        assert "\n" not in str(info.value)
    assert (tmp_path / "file").read_text() == "x"


def test_check_writable_makes_missing_folders_and_refuses_a_file_as_a_folder(tmp_path):
    check_writable(tmp_path / "a" / "b" / "out.txt")
    check_writable(tmp_path / "plots", folder=True)
    assert (tmp_path / "a" / "b").is_dir() and (tmp_path / "plots").is_dir()
    (tmp_path / "file").write_text("x")
    with pytest.raises(XindaError, match="file: cannot write"):
        check_writable(tmp_path / "file", folder=True)


def test_a_loop_of_links_is_a_one_line_error(tmp_path):
    """Before: a bare RuntimeError from Path.resolve (found by review)."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(XindaError, match="a: cannot write: a loop of symbolic links"):
        atomic_write_text(tmp_path / "a", "x")


def test_a_folder_asked_where_a_file_is_named_as_such(tmp_path):
    """Before: "f: cannot write: File exists" for `xinda grow -o f` with f a file (review)."""
    from xinda.utils import write_errors

    (tmp_path / "f").write_text("kept")
    with pytest.raises(XindaError, match=r"f: cannot write: .*f is a file, not a folder$"), \
            write_errors(tmp_path / "f"):
        (tmp_path / "f").mkdir(parents=True, exist_ok=True)
    assert (tmp_path / "f").read_text() == "kept"
