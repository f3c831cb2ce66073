"""Settings shared by the property-based (hypothesis) fuzz tests.

The default profile ``xinda-fuzz`` is derandomised (the same examples on every run, so CI is
reproducible), keeps no example database, and bounds each test to at most 100 examples. It sets
no per-example deadline: a time limit is a wall-clock assertion, and on a loaded shared machine
it fails tests that are right. A hang is still a failure: each test runs under an alarm of
``HANG_SECONDS``. For local bug hunting,
``XINDA_FUZZ_PROFILE=xinda-fuzz-deep python -m pytest tests/fuzz`` searches much longer with
fresh random examples (a few minutes).

Every fuzz test checks the same rule: an input gives either a correct result or a
``XindaError`` whose message is one line; never another exception, never a hang.
"""

from __future__ import annotations

import os
import signal

import pytest
from hypothesis import HealthCheck, settings

from xinda.errors import XindaError

settings.register_profile(
    "xinda-fuzz", max_examples=100, deadline=None, derandomize=True,
    database=None, print_blob=False, suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("xinda-fuzz-deep", parent=settings.get_profile("xinda-fuzz"),
                          max_examples=3000, derandomize=False)
settings.load_profile(os.environ.get("XINDA_FUZZ_PROFILE", "xinda-fuzz"))
HANG_SECONDS = 120 if settings().max_examples <= 100 else 1200


class Hang(Exception):
    """A fuzz test ran past HANG_SECONDS: some example hangs."""


@pytest.fixture(autouse=True)
def _fail_instead_of_hanging():
    """Turn a hang into a failure (SIGALRM; where there is none, e.g. Windows, no limit)."""
    if not hasattr(signal, "SIGALRM"):
        yield
        return

    def timeout(signum, frame):
        raise Hang(f"fuzz test still running after {HANG_SECONDS} s: an example hangs")

    previous = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(HANG_SECONDS)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def check_user_error(err: XindaError) -> str:
    """Assert that ``err`` is a clear user error: a non-empty message on ONE line. Returns it."""
    message = str(err)
    assert message.strip(), "XindaError without a message"
    assert message.splitlines() == [message], f"message is not one line: {message!r}"
    return message


@pytest.fixture(scope="session")
def user_error():
    """``user_error(err)``: assert ``err`` (a XindaError) has a one-line message; return it."""
    return check_user_error
