"""Counting decisions: per (decision, reason) for the snapshot, per tenant as a metric."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from kvgate.admission.metrics import AdmissionMetrics


class DecisionCounter:
    def __init__(self, metrics: AdmissionMetrics) -> None:
        self._metrics = metrics
        self.counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        # the metric's label children, bound once (no label set is ever removed)
        self._children: dict[tuple[str, str, str], Any] = {}

    def count(self, tenant: str, kind: str, reason: str) -> None:
        self.counts[kind][reason] += 1
        key = (tenant, kind, reason)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._metrics.decisions.labels(tenant, kind, reason)
        child.inc()

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {k: dict(v) for k, v in self.counts.items()}
