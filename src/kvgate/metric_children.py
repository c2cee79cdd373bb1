"""Prometheus label children looked up once per label set."""

from __future__ import annotations

from typing import Any


class BoundChildren:
    """``child(metric, *labels)`` is ``metric.labels(*labels)``, bound on first use: the
    per-request path skips prometheus-client's label lookup. Only for metrics whose label
    sets are never removed, so a bound child stays the one the registry exports."""

    def __init__(self) -> None:
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), labels)
        bound = self._children.get(key)
        if bound is None:
            bound = self._children[key] = metric.labels(*labels)
        return bound
