"""Prometheus metrics: the usual serving figures, and the logprob-translation counters nobody else
exposes (bytes from ids, repairs by alignment, ambiguous positions, collisions, sentinels).

Each app owns its registry, so several apps in one process (tests, the demo) never collide.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gateway.logprobs.report import TranslationReport

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_PER_TOKEN_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
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
        self.in_flight = Gauge("gateway_in_flight_requests", "Requests being served", ["route"], registry=r)
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
        self.refused = Counter("gateway_requests_refused_unsupported",
                               "Requests refused because the route cannot serve them", ["model", "route", "param"],
                               registry=r)

    def count_report(self, model: str, upstream: str, report: TranslationReport | None) -> None:
        if report is None:
            return
        for counter, value in ((self.from_ids, report.from_ids), (self.aligned, report.aligned),
                               (self.ambiguous, len(report.ambiguous_positions)),
                               (self.ambiguous_candidates, report.ambiguous_candidates),
                               (self.collisions, report.collisions), (self.sentinels, report.sentinels)):
            if value:
                counter.labels(model, upstream).inc(value)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
