"""The batching worker on its own, with a recording runner instead of a model: which jobs share
a batch (same key, within the request and token limits), the split of results, and failures
that stay with their job and never stop the thread, and batches whose requests all gave up
stopping at the next decoder step."""

from __future__ import annotations

import queue
import threading

import pytest

from xinda.decode.search import SearchStopped, check_stop
from xinda.errors import XindaError
from xinda.serve import tasks, worker
from xinda.serve.metrics import Metrics
from xinda.serve.models import ServedModel
from xinda.serve.settings import ServeSettings
from xinda.serve.worker import Job, Worker

WAIT_S = 10


@pytest.fixture
def batches(monkeypatch) -> list[list[str]]:
    """The inputs of each call of the "echo" runner (upper-cases; "boom" raises)."""
    calls: list[list[str]] = []

    def echo(_translator, options: dict, inputs: list[str]) -> list[str]:
        calls.append(list(inputs))
        if "boom" in inputs:
            raise XindaError("boom is not allowed")
        return [options.get("prefix", "") + text.upper() for text in inputs]
    monkeypatch.setitem(tasks.RUNNERS, "echo", echo)
    monkeypatch.setattr(worker, "RUNNERS", tasks.RUNNERS)
    return calls


def make_worker(**settings) -> Worker:
    model = ServedModel("fake", translator=None, task="translate", arch="none")
    return Worker(model, ServeSettings(**settings), Metrics(set()))


def job(*inputs: str, key: str = "a", **options) -> Job:
    return Job("echo", ("echo", key), options, list(inputs))


def run_all(w: Worker, jobs: list[Job]) -> list:
    """Queue ``jobs`` before the worker starts, then run it until all are done."""
    for j in jobs:
        w.submit(j)
    w.start()
    try:
        return [j.future.result(timeout=WAIT_S) if j.future.exception(WAIT_S) is None
                else j.future.exception() for j in jobs]
    finally:
        w.stop()


def test_jobs_with_the_same_key_share_a_batch_and_get_their_own_results(batches):
    results = run_all(make_worker(), [job("x", "y"), job("z"), job("w", key="b"), job("v")])
    assert results == [["X", "Y"], ["Z"], ["W"], ["V"]]
    assert batches == [["x", "y", "z", "v"], ["w"]]  # "b" waited in the backlog


def test_requests_per_batch_are_limited(batches):
    run_all(make_worker(max_batch_requests=2), [job(str(i)) for i in range(5)])
    assert batches == [["0", "1"], ["2", "3"], ["4"]]


def test_the_token_budget_is_kept(batches):
    """Tokens of an "echo" input: its length + 1; a job over the budget still runs alone."""
    run_all(make_worker(batch_tokens=6), [job("ab", "c"), job("d"), job("efghijkl"), job("m")])
    assert batches == [["ab", "c"], ["d"], ["efghijkl"], ["m"]]


def test_no_batching(batches):
    run_all(make_worker(max_batch_requests=1), [job("x"), job("y")])
    assert batches == [["x"], ["y"]]


def test_a_failing_job_fails_alone(batches):
    results = run_all(make_worker(), [job("x"), job("boom"), job("y")])
    assert results[0] == ["X"] and results[2] == ["Y"]
    assert isinstance(results[1], XindaError)
    assert batches[0] == ["x", "boom", "y"]  # then job by job
    assert sorted(map(tuple, batches[1:])) == [("boom",), ("x",), ("y",)]


def test_cancelled_jobs_are_skipped(batches):
    w, gone = make_worker(max_wait_ms=0), job("gone")
    w.submit(gone)
    gone.future.cancel()  # its request gave up (timeout)
    assert run_all(w, [job("x")]) == [["X"]]
    assert batches == [["x"]]


def test_an_abandoned_job_stops_counting_at_once(batches):
    """Before: it kept its place in the queue until the worker reached it (found by review)."""
    w, gone = make_worker(queue_size=1, max_wait_ms=0), job("gone")
    w.submit(gone)
    gone.abandon()  # its request timed out before the worker reached it
    gone.abandon()  # counted once only
    assert w.depth() == 0
    assert run_all(w, [job("x")]) == [["X"]]  # before: queue.Full
    assert batches == [["x"]] and w.depth() == 0


def test_an_abandoned_job_is_not_measured(batches, monkeypatch):
    """Measuring a job tokenises all its texts, seconds for long ones: before, the worker
    did it for jobs whose requests had gone, holding up the others (found by review)."""
    measured: list[list[str]] = []
    monkeypatch.setattr(worker, "cost", lambda _tr, _kind, inputs: measured.append(inputs) or 1)
    w, gone = make_worker(max_wait_ms=0), job("gone")
    w.submit(gone)
    gone.abandon()
    assert run_all(w, [job("x")]) == [["X"]]
    assert measured == [["x"]]


def test_the_worker_survives_any_exception(batches, monkeypatch):
    """A failure outside the runner (here: the metrics) is logged; the thread goes on."""
    w = make_worker(max_wait_ms=0)
    monkeypatch.setattr(worker, "cost", lambda *_: 1 // 0)  # counting tokens fails: no matter
    monkeypatch.setattr(w.metrics, "batch", lambda *_: 1 // 0)
    first = job("x")
    w.submit(first)
    w.start()
    try:
        assert first.future.result(timeout=WAIT_S) == ["X"]
        later = job("y")
        w.submit(later)
        assert later.future.result(timeout=WAIT_S) == ["Y"]
    finally:
        w.stop()


def test_a_failure_while_collecting_fails_the_jobs_taken(batches):
    """An unbounded wait (``max_wait_ms`` inf, which the settings refuse) makes the queue's
    get raise once a job is taken: that job fails instead of waiting forever."""
    settings = ServeSettings().model_copy(update={"max_wait_ms": float("inf")})
    w = Worker(ServedModel("fake", None, "translate", "none"), settings, Metrics(set()))
    taken = job("x")
    w.submit(taken)
    w.start()
    try:
        assert isinstance(taken.future.exception(timeout=WAIT_S), OverflowError)
        assert batches == []
    finally:
        w.stop()


@pytest.fixture
def decoding(monkeypatch) -> dict[str, threading.Event]:
    """A "decode" runner that steps like a search (``check_stop`` before each step) until
    ``release`` is set, after setting ``started``."""
    events = {"started": threading.Event(), "release": threading.Event()}

    def decode(_translator, _options: dict, inputs: list[str]) -> list[str]:
        events["started"].set()
        while not events["release"].wait(0.001):
            check_stop()
        return [text.upper() for text in inputs]
    monkeypatch.setitem(tasks.RUNNERS, "decode", decode)
    monkeypatch.setattr(worker, "RUNNERS", tasks.RUNNERS)
    return events


def test_a_batch_whose_requests_all_gave_up_stops_decoding(decoding):
    """Before: a timed-out request's decode ran to its end, holding up the queue."""
    w = make_worker(max_wait_ms=0)
    running, later = Job("decode", ("decode",), {}, ["x"]), Job("decode", ("decode",), {}, ["y"])
    w.submit(running)
    w.start()
    try:
        assert decoding["started"].wait(WAIT_S)
        running.abandon()  # its request timed out while it was being decoded
        assert isinstance(running.future.exception(timeout=WAIT_S), SearchStopped)
        assert w.metrics.stopped_batches.labels("fake")._value.get() == 1
        decoding["release"].set()
        w.submit(later)
        assert later.future.result(timeout=WAIT_S) == ["Y"]  # the worker goes on
    finally:
        w.stop()


def test_a_batch_decodes_on_while_one_of_its_requests_waits(decoding):
    w = make_worker(max_wait_ms=500)
    gone, waiting = Job("decode", ("decode",), {}, ["x"]), Job("decode", ("decode",), {}, ["y"])
    w.submit(gone)
    w.submit(waiting)
    w.start()
    try:
        assert decoding["started"].wait(WAIT_S)
        gone.abandon()
        decoding["release"].set()
        assert waiting.future.result(timeout=WAIT_S) == ["Y"]
        assert w.metrics.stopped_batches.labels("fake")._value.get() == 0
    finally:
        w.stop()


def decode_job(key: int, text: str) -> Job:
    return Job("decode", ("decode", key), {}, [text])


def test_jobs_in_the_backlog_count_against_the_queue_size(decoding):
    """Before: jobs moved to the backlog freed their places in the queue, so queue_size +
    max_batch_requests jobs could wait (found by review)."""
    w = make_worker(queue_size=2)
    running, other = decode_job(1, "x"), decode_job(2, "y")
    w.submit(running)
    w.submit(other)
    w.start()
    try:
        assert decoding["started"].wait(WAIT_S)  # "other" (another key) waits in the backlog
        later = decode_job(2, "z")
        w.submit(later)
        assert w.depth() == 2
        with pytest.raises(queue.Full):
            w.submit(decode_job(3, "w"))
        decoding["release"].set()
        assert [j.future.result(WAIT_S) for j in (running, other, later)] == [["X"], ["Y"], ["Z"]]
        assert w.depth() == 0
    finally:
        decoding["release"].set()
        w.stop()


def test_an_abandoned_job_in_the_backlog_frees_its_place_and_is_skipped(decoding):
    w = make_worker(queue_size=2)
    running, gone, queued = decode_job(1, "x"), decode_job(2, "y"), decode_job(3, "w")
    w.submit(running)
    w.submit(gone)
    w.start()
    try:
        assert decoding["started"].wait(WAIT_S)  # "gone" waits in the backlog
        w.submit(queued)
        gone.abandon()  # its request gave up
        assert w.depth() == 1
        later = decode_job(2, "z")
        w.submit(later)
        decoding["release"].set()
        assert [queued.future.result(WAIT_S), later.future.result(WAIT_S)] == [["W"], ["Z"]]
        assert gone.future.cancelled() and w.depth() == 0
    finally:
        decoding["release"].set()
        w.stop()


def test_jobs_still_queued_at_shutdown_get_503(batches):
    """Before: a RuntimeError, which the app turned into 500 "internal" (found by review)."""
    from xinda.serve.errors import ApiError

    w = make_worker()
    waiting = job("x")
    w.submit(waiting)
    w.stop()  # never started: the job is still queued
    error = waiting.future.exception(WAIT_S)
    assert isinstance(error, ApiError) and (error.status, error.code) == (503, "shutting_down")


def test_a_job_no_other_can_join_waits_for_none(batches, monkeypatch):
    """Before: a sampling request (a key of its own) still waited max_wait_ms for jobs that
    could never join it (found by review)."""
    from xinda.serve.worker import POLL_S

    w, waits = make_worker(max_wait_ms=1000), []
    take = w._take

    def recorded(timeout: float):
        waits.append(timeout)
        return take(timeout)
    monkeypatch.setattr(w, "_take", recorded)
    jobs = [job("x"), job("y")]
    for each in jobs:
        each.alone = True
    assert run_all(w, jobs) == [["X"], ["Y"]]
    assert batches == [["x"], ["y"]] and max(waits) <= POLL_S  # only the loop's polls
