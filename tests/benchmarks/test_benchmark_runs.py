"""How the benchmark scripts count and chain runs: throughput windows, time budgets, warm-up."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import decode_speed
import progressive
import serve_load


def back_to_back(latency: float, first_start: float, end: float) -> list[serve_load.Sample]:
    """One client's requests, each sent when the last one answered."""
    samples, start = [], first_start
    while start + latency <= end:
        samples.append(serve_load.Sample(start, start + latency, "200", 1))
        start += latency
    return samples


def test_serve_load_counts_the_requests_that_end_inside_the_window():
    """A fast client (1 s) and a slow one (3 s) started in the warm-up, window 0-10 s: 10 + 4
    requests end inside it. Before, only those that also started inside counted (9 + 3): the
    slow client lost a larger share, which inflated ratios of fast runs over slow ones."""
    samples = back_to_back(1.0, -0.5, 12.0) + back_to_back(3.0, -2.0, 12.0)
    summary = serve_load.summarize(samples, (0.0, 10.0))
    assert summary["requests"] == 14 and summary["requests_per_s"] == 1.4
    assert summary["p95_ms"] == 3000.0  # the slow client's requests are among them


def test_progressive_gives_the_deep_phase_the_rest_of_the_whole_budget(tmp_path):
    """train.max_seconds counts the shallow phase too (the grown model keeps its clock): the
    resumed run's limit is the total budget. Before, it was the deep share alone, already
    spent: the grown model trained no update."""
    args = SimpleNamespace(budget=1800.0, shallow_share=0.5, layers=12)
    command = progressive.deep_phase(tmp_path / "model-12l", args)
    assert command[-4:] == [str(tmp_path / "model-12l" / "config.yaml"), "--resume", "--set",
                            "train.max_seconds=1800.0"]


def test_decode_speed_sets_every_system_up_before_timing_it():
    """The first call of each system (int8: quantising the model) is not timed."""
    calls: list[tuple[str, int]] = []

    def system(name):
        def decode(sources, beam, batch):
            calls.append((name, len(sources)))
            return [["a"] for _ in sources]
        return decode

    found = {"x": system("x"), "y": system("y")}
    sources = [["a"]] * 3
    rows = decode_speed.measure(found, sources, ["a"] * 3, " ".join, repeats=2, latency=1)
    assert calls[:2] == [("x", 3), ("y", 3)]  # untimed, before the first timed repeat
    # each repeat: beam 5, greedy and the batch-1 latency of x, then of y (before: the
    # latencies ran once, one system after the other, after all the repeats)
    assert calls[2:] == [("x", 3), ("x", 3), ("x", 1), ("y", 3), ("y", 3), ("y", 1)] * 2
    assert all(row["latency_ms_beam5"] >= 0 for row in rows)


if __name__ == "__main__":
    pytest.main([__file__])
