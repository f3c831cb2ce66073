"""SIGINT (Ctrl-C) and SIGTERM while training: the first asks training to stop at the next
update boundary (with a checkpoint), a second stops at once. Under torchrun a signal repeated
within a second counts once (torchrun passes on the Ctrl-C its ranks already got from the
terminal)."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("xinda")


class StopSignals:
    """``received``: the first SIGINT/SIGTERM that came while ``installed`` (None: none)."""

    def __init__(self, several_ranks: bool = False):
        self.several_ranks = several_ranks
        self.received: int | None = None
        self.time = 0.0  # when it came (time.monotonic())

    @contextmanager
    def installed(self) -> Iterator[None]:
        """Handle SIGINT and SIGTERM in this block (main thread only); the previous handlers
        come back after it. A signal that is ignored (SIG_IGN, e.g. under nohup) stays so."""
        previous, self.received = {}, None
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                handler = signal.getsignal(sig)
                if handler is not signal.SIG_IGN:
                    previous[sig] = handler
                    signal.signal(sig, self._on_signal)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, signal.SIG_DFL if handler is None else handler)

    def _on_signal(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.several_ranks and time.monotonic() - self.time < 1.0:
            return  # the same Ctrl-C again, passed on by torchrun
        if self.received is not None:
            log.warning("%s again: stopping now (the checkpoints written so far are kept)", name)
            raise KeyboardInterrupt
        self.received, self.time = signum, time.monotonic()
        log.warning("%s: stopping after the current update, with a checkpoint (send it again "
                    "to stop at once)", name)
