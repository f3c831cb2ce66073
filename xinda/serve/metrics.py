"""Prometheus metrics of one app, in its own registry (many apps can live in one process):
requests by endpoint and status, latency, queue depth, batch sizes and decoding throughput."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Metrics:
    """The app's metrics; ``render`` gives the Prometheus text format."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, endpoints: set[str]):
        self.endpoints = endpoints  # other paths count as "other" (bounded label values)
        self.registry = reg = CollectorRegistry()
        self.requests = Counter("xinda_requests", "HTTP requests by endpoint and status",
                                ["endpoint", "status"], registry=reg)
        self.in_flight = Gauge("xinda_requests_in_flight", "HTTP requests being handled",
                               registry=reg)
        self.latency = Histogram("xinda_request_seconds", "HTTP request latency", ["endpoint"],
                                 buckets=LATENCY_BUCKETS, registry=reg)
        self.queue_depth = Gauge("xinda_queue_depth", "jobs waiting for a model's worker",
                                 ["model"], registry=reg)
        self.batch_requests = Histogram("xinda_batch_requests", "requests decoded in one batch",
                                        ["model"], buckets=SIZE_BUCKETS, registry=reg)
        self.batch_sentences = Histogram("xinda_batch_sentences", "sentences decoded in one "
                                         "batch", ["model"], buckets=SIZE_BUCKETS, registry=reg)
        self.sentences = Counter("xinda_sentences", "sentences decoded", ["model"], registry=reg)
        self.stopped_batches = Counter("xinda_stopped_batches", "batches whose decoding "
                                       "stopped because all their requests timed out or "
                                       "disconnected", ["model"], registry=reg)
        self.sentences_per_second = Gauge("xinda_sentences_per_second", "decoding throughput "
                                          "of the model's last batch", ["model"], registry=reg)

    def request(self, path: str, status: int, seconds: float) -> None:
        endpoint = path if path in self.endpoints else "other"
        self.requests.labels(endpoint, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)

    def watch_queue(self, model: str, depth: Callable[[], int]) -> None:
        self.queue_depth.labels(model).set_function(depth)

    def batch(self, model: str, requests: int, sentences: int, seconds: float) -> None:
        self.batch_requests.labels(model).observe(requests)
        self.batch_sentences.labels(model).observe(sentences)
        self.sentences.labels(model).inc(sentences)
        self.sentences_per_second.labels(model).set(sentences / max(seconds, 1e-9))

    def stopped(self, model: str) -> None:
        """A batch of abandoned requests stopped decoding."""
        self.stopped_batches.labels(model).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
