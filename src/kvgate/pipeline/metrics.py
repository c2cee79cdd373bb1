"""Prometheus metrics of the request pipeline (kvgate_ prefix, injectable registry)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from kvgate.metric_children import BoundChildren


class PipelineMetrics(BoundChildren):
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.retries = Counter(
            "kvgate_retries",
            "Dispatches retried on another node, by cause",
            ["cause"],
            registry=registry,
        )
        self.retry_budget_exhausted = Counter(
            "kvgate_retry_budget_exhausted",
            "Retries refused because the retry budget was spent",
            registry=registry,
        )
        self.upstream_errors = Counter(
            "kvgate_upstream_errors",
            "Failed upstream dispatches, by node and kind",
            ["node", "kind"],
            registry=registry,
        )
        self.dispatches = Counter(
            "kvgate_dispatches",
            "Upstream dispatches, by node and route reason",
            ["node", "reason"],
            registry=registry,
        )
        self.cancellations = Counter(
            "kvgate_cancellations",
            "Requests whose client left, by stage (queued: dropped unadmitted; upstream: "
            "engine request cancelled)",
            ["stage"],
            registry=registry,
        )
        self.degraded = Counter(
            "kvgate_degraded_routes",
            "Admitted-but-degraded requests, by what the pipeline applied to the route",
            ["mode"],
            registry=registry,
        )
        super().__init__()
