"""The per-model inference worker: a thread that owns the model and batches across requests.

Requests become ``Job``s in a queue. The worker takes the oldest job, then collects more jobs
with the same ``key`` (the same task and decode options) for up to ``max_wait_ms``, until
``max_batch_requests`` jobs or ``batch_tokens`` source tokens; jobs with other keys wait in a
backlog, first in line for the next batch. At most ``queue_size`` jobs wait, in the queue and
the backlog together; a job whose request gave up stops counting at once, and is skipped. One
library call decodes the batch's inputs together and each job's future gets its own slice of
the results; once every request of a batch has given up (timed out or disconnected), its search
stops at the next decoder step. A batch that fails is retried job by job, so that one bad job
fails alone; an exception is a job's error, never the end of the thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from xinda.decode.search import SearchStopped, stop_when
from xinda.serve.errors import ApiError
from xinda.serve.metrics import Metrics
from xinda.serve.models import ServedModel
from xinda.serve.settings import ServeSettings
from xinda.serve.tasks import RUNNERS, cost

log = logging.getLogger("xinda")
POLL_S = 0.1  # how often an idle worker checks whether it should stop


@dataclass(eq=False)
class Job:
    kind: str  # a key of tasks.RUNNERS
    key: tuple  # jobs with equal keys can share a batch: (kind, options[, a key of its own])
    options: dict  # the runner's options (equal for equal keys)
    inputs: list[Any]  # the runner's inputs: results come back one per input
    future: Future = field(default_factory=Future)
    tokens: int = 0  # source tokens, counted by the worker
    abandoned: threading.Event = field(default_factory=threading.Event)  # its request gave up
    waiting: bool = False  # counted among its worker's waiting jobs
    leave: Callable[[], None] | None = None  # ends that count (set by ``Worker.submit``)
    alone: bool = False  # no other job can join it (its key is its own): nothing to wait for

    def abandon(self) -> None:
        """The request stopped waiting: the job no longer counts as waiting and is skipped, or
        its decoding stops if every job of its batch was abandoned."""
        self.abandoned.set()
        self.future.cancel()  # only takes effect while the job still waits
        if self.leave is not None:
            self.leave()


class Worker:
    """One model's batching thread; ``submit`` raises ``queue.Full`` when the queue is full."""

    def __init__(self, model: ServedModel, settings: ServeSettings, metrics: Metrics):
        self.model, self.settings, self.metrics = model, settings, metrics
        self.queue: queue.Queue[Job] = queue.Queue()  # bounded by ``submit``
        self.backlog: deque[Job] = deque()  # taken from the queue, not yet batched
        self._lock = threading.Lock()
        self._waiting = 0  # jobs counted as waiting, in the queue or the backlog
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"xinda-serve:{model.name}",
                                        daemon=True)
        metrics.watch_queue(model.name, self.depth)

    def submit(self, job: Job) -> Future:
        """Queue ``job``; ``queue.Full`` when ``queue_size`` jobs wait already."""
        with self._lock:
            if self._waiting >= self.settings.queue_size:
                raise queue.Full
            self._waiting += 1
            job.waiting, job.leave = True, lambda: self._leave(job)
        self.queue.put_nowait(job)
        return job.future

    def depth(self) -> int:
        """Jobs waiting, in the queue and in the backlog (abandoned ones not counted)."""
        return self._waiting

    def _leave(self, job: Job) -> None:
        """``job`` stops waiting (batched, abandoned or failed): it no longer counts, once."""
        with self._lock:
            if job.waiting:
                job.waiting = False
                self._waiting -= 1

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the current batch; jobs still waiting fail."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        while True:
            try:
                job = self.backlog.popleft() if self.backlog else self.queue.get_nowait()
            except (IndexError, queue.Empty):  # none left (or the thread, still on, took it)
                break
            self._leave(job)
            _fail(job, ApiError(503, "shutting_down", "the server is shutting down: retry "
                                "later"))

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                batch = self._collect()
                if batch:
                    self._run(batch)
            except Exception:  # the worker outlives any failure
                log.exception("xinda serve: worker %s", self.model.name)

    def _take(self, timeout: float) -> Job | None:
        """The next job from the queue, its tokens counted, or None after ``timeout`` s."""
        try:
            job = self.queue.get(timeout=timeout) if timeout > 0 else self.queue.get_nowait()
        except queue.Empty:
            return None
        if job.abandoned.is_set():  # (counting tokenises every text: not for nothing)
            return job
        try:
            job.tokens = cost(self.model.translator, job.kind, job.inputs)
        except Exception:  # noqa: BLE001 - the runner will say what is wrong with the job
            job.tokens = 0
        return job

    def _collect(self) -> list[Job]:
        """The next batch: the oldest job and the waiting jobs with its key, within the limits;
        jobs whose requests gave up (abandoned, or cancelled futures) are dropped. If
        collecting fails, the jobs taken fail with its error."""
        first = self.backlog.popleft() if self.backlog else self._take(POLL_S)
        if first is None or first.abandoned.is_set():
            return []
        self._leave(first)
        batch = [first]
        try:
            self._fill(batch)
        except Exception as err:  # the jobs taken fail, their requests wait for nothing
            for job in batch:
                _fail(job, err)
            raise
        return [job for job in batch if job.future.set_running_or_notify_cancel()]

    def _fill(self, batch: list[Job]) -> None:
        """Add to ``batch`` (its first job taken) the waiting jobs with its key, from the
        backlog and then from the queue for up to ``max_wait_ms``, within the limits."""
        first, tokens = batch[0], batch[0].tokens
        for job in [j for j in self.backlog if j.abandoned.is_set()]:  # skipped
            self.backlog.remove(job)
        for job in [j for j in self.backlog if j.key == first.key]:
            if not self._room(batch, tokens, job):
                break
            self.backlog.remove(job)
            tokens += self._add(batch, job)
        if first.alone:  # no job can join it: nothing to wait for
            return
        deadline = time.monotonic() + self.settings.max_wait_ms / 1000
        while self._room(batch, tokens) and len(self.backlog) < self.settings.max_batch_requests:
            job = self._take(deadline - time.monotonic())
            if job is None:
                break
            if job.abandoned.is_set():  # skipped
                continue
            if job.key == first.key and self._room(batch, tokens, job):
                tokens += self._add(batch, job)
            else:
                self.backlog.append(job)

    def _add(self, batch: list[Job], job: Job) -> int:
        """Add ``job`` to ``batch``, where it no longer waits; its tokens."""
        self._leave(job)
        batch.append(job)
        return job.tokens

    def _room(self, batch: list[Job], tokens: int, job: Job | None = None) -> bool:
        """Whether the batch has room for ``job`` (or, without one, for any more tokens)."""
        if len(batch) >= self.settings.max_batch_requests:
            return False
        if job is None:
            return tokens < self.settings.batch_tokens
        return tokens + job.tokens <= self.settings.batch_tokens

    def _run(self, batch: list[Job]) -> None:
        """Decode ``batch`` in one call and resolve each job; a failed batch is retried job by
        job."""
        if not batch:
            return
        first = batch[0]
        inputs = [item for job in batch for item in job.inputs]
        start = time.perf_counter()
        try:
            with stop_when(lambda: all(job.abandoned.is_set() for job in batch)):
                results = RUNNERS[first.kind](self.model.translator, first.options, inputs)
        except SearchStopped as err:  # nobody waits for these results any more
            self.metrics.stopped(self.model.name)
            for job in batch:
                job.future.set_exception(err)
            return
        except Exception as err:  # noqa: BLE001 - becomes the job's error
            if len(batch) == 1:
                first.future.set_exception(err)
            else:
                for job in batch:
                    self._run([job])
            return
        seconds, offset = time.perf_counter() - start, 0
        try:  # counted before the answers, so a client's next /metrics read includes its batch
            self.metrics.batch(self.model.name, len(batch), len(inputs), seconds)
        finally:  # and the jobs are answered even if counting fails
            for job in batch:
                job.future.set_result(results[offset:offset + len(job.inputs)])
                offset += len(job.inputs)


def _fail(job: Job, err: BaseException) -> None:
    """Fail ``job`` with ``err``, unless its request gave up (cancelled) already."""
    if job.future.set_running_or_notify_cancel():
        job.future.set_exception(err)
