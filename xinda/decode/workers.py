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

import ctypes
import multiprocessing
import os
import pickle
import signal
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

import torch

from xinda.errors import XindaError
from xinda.utils import interrupts_deferred

T = TypeVar("T")
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies (Linux)
_job: Callable[[int], object] | None = None  # in a worker: what it runs (given when forked)


def _start_worker(job: Callable[[int], object], parent: int) -> None:
    global _job
    _job = job
    torch.set_num_threads(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the group: it is the parent's
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the parent's handler, if it had one
    if sys.platform.startswith("linux"):  # a killed parent takes its workers with it
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it died before prctl
        os._exit(1)


def _run(index: int) -> bytes:
    """``job(index)`` pickled by value: a pool would send each tensor's storage as a file
    descriptor, one per tensor (a batch's greedy attention matrices ran out of ``ulimit -n``)."""
    assert _job is not None, "a worker without a job"
    try:
        return pickle.dumps(_job(index), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as err:  # one that pickle cannot rebuild would break the pool
        try:
            pickle.loads(pickle.dumps(err))
        except (TypeError, AttributeError, pickle.PicklingError):
            raise RuntimeError(f"{type(err).__name__}: {err}") from None
        raise


def map_in_workers(job: Callable[[int], T], order: Sequence[int], workers: int) -> dict[int, T]:
    """``{i: job(i)}`` for the indices in ``order``, handed out in that order to ``workers``
    forked processes as they become free (in this process for one worker or one index). The
    job is handed to the workers as they are forked, not pickled: it may be a closure."""
    if workers <= 1 or len(order) <= 1:
        return {i: job(i) for i in order}
    pool = ProcessPoolExecutor(min(workers, len(order)), initializer=_start_worker,
                               initargs=(job, os.getpid()),
                               mp_context=multiprocessing.get_context("fork"))
    try:
        return {i: pickle.loads(result) for i, result in zip(order, pool.map(_run, order))}
    except BrokenProcessPool as err:
        # the cause's last line that says something (its traceback ends with a quote line)
        said = [line.strip() for line in str(err.__cause__ or "").splitlines()
                if line.strip(" '\"")]
        why = f" ({said[-1]})" if said else ""
        raise XindaError(f"a decode.workers process died{why} (killed, or out of memory?): "
                         f"decode again with fewer than {workers} workers") from None
    finally:
        with interrupts_deferred():
            pool.shutdown(wait=True, cancel_futures=True)
