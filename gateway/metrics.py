"""Prometheus metrics: the usual serving figures, and the logprob-translation counters nobody else
exposes (bytes from ids, repairs by alignment, ambiguous positions, collisions, sentinels).

Each app owns its registry, so several apps in one process (tests, the demo) never collide.
With `serve --workers N` (gateway.workers) the values live in prometheus_client's multiprocess
files instead (`enable_multiprocess`, before the app is built): each worker writes its own, and a
scrape of any worker sums them all (counters and histograms summed, including workers that have
since died; the in-flight gauge summed over live workers), every label kept.

Labelled children are looked up once and kept (`child`, `ReportCounters`): prometheus_client's
`labels()` validates, stringifies and locks on every call, which adds up per stream chunk. A child
is still created at the first update that needs it, so the exposition shows the same series.
"""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, values
from prometheus_client.multiprocess import MultiProcessCollector

from gateway.logprobs.report import TranslationReport

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_PER_TOKEN_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)


_multiprocess_dir: str | None = None


def enable_multiprocess(directory: str) -> None:
    """From now on, metrics made in this process (and its forks) keep their values in `directory`,
    one file per process, and `exposition` sums the files. Call before the first Metrics()."""
    global _multiprocess_dir
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory  # where prometheus_client's values write
    values.ValueClass = values.MultiProcessValue()
    _multiprocess_dir = directory


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.multiprocess_dir = _multiprocess_dir
        r = self.registry
        route = ["model", "upstream", "route", "stream"]
        self.requests = Counter("gateway_requests", "Requests answered", [*route, "status"], registry=r)
        self.duration = Histogram("gateway_request_duration_seconds", "Whole request time", route,
                                  buckets=_LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("gateway_time_to_first_token_seconds", "Request start to first token sent", route,
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.per_token = Histogram("gateway_time_per_output_token_seconds", "Generation time per output token",
                                   ["model", "upstream"], buckets=_PER_TOKEN_BUCKETS, registry=r)
        self.tokens = Counter("gateway_tokens", "Tokens in (prompt) and out (completion)",
                              ["model", "upstream", "direction"], registry=r)
        self.upstream_latency = Histogram("gateway_upstream_latency_seconds", "Upstream time to response headers",
                                          ["upstream", "replica"], buckets=_LATENCY_BUCKETS, registry=r)
        self.upstream_errors = Counter("gateway_upstream_errors", "Upstream faults by replica and kind",
                                       ["upstream", "replica", "kind"], registry=r)
        self.ejections = Counter("gateway_replica_ejections", "Replicas ejected by outlier detection, by the "
                                 "fault that ejected them", ["upstream", "replica", "kind"], registry=r)
        self.in_flight = Gauge("gateway_in_flight_requests", "Requests being served", ["route"], registry=r,
                               multiprocess_mode="livesum")
        labels = ["model", "upstream"]
        self.from_ids = Counter("gateway_logprob_tokens_from_ids", "Tokens whose bytes came from token ids",
                                labels, registry=r)
        self.aligned = Counter("gateway_logprob_tokens_aligned", "Tokens repaired by aligning against the text",
                               labels, registry=r)
        self.ambiguous = Counter("gateway_logprob_ambiguous_positions", "Tokens whose bytes stayed ambiguous",
                                 labels, registry=r)
        self.ambiguous_candidates = Counter("gateway_logprob_ambiguous_candidates",
                                            "Alternatives whose bytes could not be recovered", labels, registry=r)
        self.collisions = Counter("gateway_logprob_collisions_resolved",
                                  "Completions dict keys two candidates shared, kept apart", labels, registry=r)
        self.sentinels = Counter("gateway_logprob_sentinels_mapped", "null/-inf/NaN logprobs mapped to -9999",
                                 labels, registry=r)
        self.per_character = Counter("gateway_logprob_per_character_tokens",
                                     "Split-character fragments spelled per character (no tokenizer: bytes unknowable)",
                                     labels, registry=r)
        self.refused = Counter("gateway_requests_refused_unsupported",
                               "Requests refused because the route cannot serve them", ["model", "route", "param"],
                               registry=r)
        self.hosted_dropped = Counter("gateway_hosted_tools_dropped",
                                      "Hosted tools (web_search, mcp, ...) left out of upstream requests",
                                      ["model", "tool"], registry=r)
        self.store_writes = Counter("gateway_store_writes", "Responses committed to the response store", registry=r)
        self.store_write_failures = Counter("gateway_store_write_failures",
                                            "Responses the store failed to save (each is logged with its id)",
                                            registry=r)
        self.store_queue = Gauge("gateway_store_queue_depth", "Responses waiting for the store's writer", registry=r,
                                 multiprocess_mode="livesum")  # one figure over the live workers
        self._children: dict[tuple[Any, ...], Any] = {}
        self._reports: dict[tuple[str, str], ReportCounters] = {}

    def child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, remembered (label values must be strings)."""
        key = (metric, *labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def store_counters(self) -> StoreCounters:
        return StoreCounters(self)

    def report_counters(self, model: str, upstream: str) -> ReportCounters:
        """The translation counters of one route, to count many reports cheaply."""
        found = self._reports.get((model, upstream))
        if found is None:
            found = self._reports[(model, upstream)] = ReportCounters(self, model, upstream)
        return found

    def count_report(self, model: str, upstream: str, report: TranslationReport | None) -> None:
        if report is not None:
            self.report_counters(model, upstream).count(report)

    def exposition(self) -> bytes:
        if self.multiprocess_dir is None:
            return generate_latest(self.registry)
        every_worker = CollectorRegistry()
        MultiProcessCollector(every_worker, path=self.multiprocess_dir)
        return generate_latest(every_worker)


class StoreCounters:
    """What the response store's writer reports (gateway.store.writer)."""

    def __init__(self, metrics: Metrics) -> None:
        self._writes, self._failures = metrics.store_writes, metrics.store_write_failures
        self._queue = metrics.store_queue

    def written(self, count: int) -> None:
        self._writes.inc(count)

    def failed(self, count: int) -> None:
        self._failures.inc(count)

    def queued(self, depth: int) -> None:
        self._queue.set(depth)


class ReportCounters:
    """What parsing repaired, summed into one route's counters (children made on first use).

    `count` adds one report now. A stream adds each chunk's report with `add` (cheap: no lock, no
    label lookup) and calls `flush` now and then and when it ends. The pending sums are shared by
    every request of the route; whichever flushes counts them all.
    """

    _NAMES = ("from_ids", "aligned", "ambiguous", "ambiguous_candidates", "collisions", "sentinels", "per_character")

    __slots__ = ("_children", "_labels", "_metrics", "_pending")

    def __init__(self, metrics: Metrics, model: str, upstream: str) -> None:
        self._metrics = metrics
        self._labels = (model, upstream)
        self._children: list[Any] = [None] * 7
        self._pending = [0] * 7

    def count(self, report: TranslationReport | None) -> None:
        if report is not None:
            self.add(report)
            self.flush()

    def add_from_ids(self, count: int) -> None:
        """`add` of a report of `count` tokens read from their ids and nothing else."""
        self._pending[0] += count

    def add(self, report: TranslationReport | None) -> None:
        if report is None:
            return
        pending = self._pending
        if report.from_ids:
            pending[0] += report.from_ids
        if report.aligned:
            pending[1] += report.aligned
        if report.ambiguous_positions:
            pending[2] += len(report.ambiguous_positions)
        if report.ambiguous_candidates:
            pending[3] += report.ambiguous_candidates
        if report.collisions:
            pending[4] += report.collisions
        if report.sentinels:
            pending[5] += report.sentinels
        if report.per_character:
            pending[6] += report.per_character

    def flush(self) -> None:
        pending = self._pending
        for index, value in enumerate(pending):
            if value:
                child = self._children[index]
                if child is None:
                    child = self._children[index] = getattr(self._metrics, self._NAMES[index]).labels(*self._labels)
                pending[index] = 0
                child.inc(value)
