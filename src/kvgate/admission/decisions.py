"""Counting decisions: per (decision, reason) for the snapshot, per tenant as a metric."""

from __future__ import annotations

from collections import defaultdict

from kvgate.admission.metrics import AdmissionMetrics


class DecisionCounter:
    def __init__(self, metrics: AdmissionMetrics) -> None:
        self._metrics = metrics
        self.counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    def count(self, tenant: str, kind: str, reason: str) -> None:
        self.counts[kind][reason] += 1
        self._metrics.decisions.labels(tenant, kind, reason).inc()

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {k: dict(v) for k, v in self.counts.items()}
