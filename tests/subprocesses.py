"""Running the real ``xinda`` command from tests: the executable, a single-threaded environment
without progress bars, and a free port on 127.0.0.1 (``pythonpath = tests`` in pyproject)."""

from __future__ import annotations

import os
import shutil
import socket
import sys
from pathlib import Path


def xinda_command() -> list[str]:
    """The venv's ``xinda`` script (works without an activated venv), else ``python -m``."""
    script = Path(sys.executable).with_name("xinda")
    if script.is_file():
        return [str(script)]
    found = shutil.which("xinda")
    return [found] if found else [sys.executable, "-m", "xinda.cli"]


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment of a test's subprocess: one torch thread, no progress bars."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1", "PYTHONIOENCODING": "utf-8", "TQDM_DISABLE": "1", **extra}


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
