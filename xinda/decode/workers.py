"""Decoding batches side by side in forked processes on CPU (``decode.workers``).

At decoding's batch sizes a step is ~100 small PyTorch operations whose dispatch from Python
costs more than their arithmetic, and torch's intra-op threads cannot share that cost out: two
processes with one thread each decode more sentences per second than one process with two
threads (docs/benchmarks.md). The workers are forked once the model is loaded (and quantised),
so they share its weights; each decodes whole batches, the same batches as one process.
A worker has exactly one thread: GNU OpenMP does not survive a fork once the parent has used
its thread team, and a forked child that starts a new team hangs.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

import torch

from xinda.errors import XindaError
from xinda.utils import interrupts_deferred

T = TypeVar("T")
_JOB: Callable[[int], object] | None = None  # what the forked workers run: set before forking


def _start_worker() -> None:
    torch.set_num_threads(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the group: it is the parent's


def _run(index: int) -> object:
    assert _JOB is not None, "forked without a job"
    return _JOB(index)


def map_in_workers(job: Callable[[int], T], order: Sequence[int], workers: int) -> dict[int, T]:
    """``{i: job(i)}`` for the indices in ``order``, handed out in that order to ``workers``
    forked processes as they become free (in this process for one worker or one index)."""
    global _JOB
    if workers <= 1 or len(order) <= 1:
        return {i: job(i) for i in order}
    _JOB = job
    pool = ProcessPoolExecutor(min(workers, len(order)), initializer=_start_worker,
                               mp_context=multiprocessing.get_context("fork"))
    try:
        return dict(zip(order, pool.map(_run, order)))
    except BrokenProcessPool:
        raise XindaError(f"a decode.workers process died (killed, or out of memory?): decode "
                         f"again with fewer than {workers} workers") from None
    finally:
        _JOB = None
        with interrupts_deferred():
            pool.shutdown(wait=True, cancel_futures=True)
