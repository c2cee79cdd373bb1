"""Passive outlier detection: nodes that fail requests are ejected at once.

Envoy's outlier detection is the model. Every attempt's outcome is reported here by the
request pipeline: consecutive connect failures, resets and timeouts (``connect`` class)
or consecutive gateway-side 5xx answers (``5xx`` class) eject the node. An ejected node
takes no first try and no retry; it is probed (a cheap health request, made by the
pipeline's driver) when its ejection ends, and only a successful probe puts it back in
rotation. Each failed probe doubles the ejection (up to ``max_ejection_s``); a success
resets it. Report staleness stays the second, slower signal (the node view).

Clock-free: every method takes ``now``, so the live gateway and the simulator share it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger("kvgate.routing.outlier")

# Failure kinds that say "the node is not answering" (not "the answer was an error").
CONNECT_KINDS = frozenset({"connect", "disconnected", "read", "timeout", "stream_broken"})
EJECTED = "ejected"
PROBING = "probing"


class OutlierConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    consecutive_connect_failures: int = Field(default=1, ge=1)  # refused/reset/timed out
    consecutive_5xx: int = Field(default=3, ge=1)  # 502/503/504 answers in a row
    base_ejection_s: float = Field(default=1.0, gt=0)  # first ejection; doubles per failed probe
    max_ejection_s: float = Field(default=30.0, gt=0)
    probe_timeout_s: float = Field(default=1.0, gt=0)


@dataclass(slots=True)
class _NodeHealth:
    connect_failures: int = 0
    http_failures: int = 0
    ejections: int = 0  # consecutive (reset by a successful probe)
    ejected_until: float | None = None  # None: in rotation
    reason: str = ""
    probing: bool = False  # a probe is in flight


class OutlierDetector:
    def __init__(
        self,
        config: OutlierConfig | None = None,
        *,
        enabled: Callable[[], bool] = lambda: True,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.config = config or OutlierConfig()
        self._enabled = enabled
        self._nodes: dict[str, _NodeHealth] = {}
        self._out: frozenset[str] = frozenset()  # nodes out of rotation (kept current)
        self.ejections_total = Counter(
            "kvgate_outlier_ejections",
            "Nodes taken out of rotation by passive failure detection, by node and reason",
            ["node", "reason"],
            registry=registry,
        )
        self.probes_total = Counter(
            "kvgate_outlier_probes",
            "Re-admission probes of ejected nodes, by node and result",
            ["node", "result"],
            registry=registry,
        )
        if registry is not None:
            registry.register(_EjectedCollector(self))

    # -- what routing may use -------------------------------------------------------
    def ejected(self) -> frozenset[str]:
        """Nodes out of rotation now (ejected, or waiting for a successful probe)."""
        return self._out if self._out and self._enabled() else frozenset()

    def state(self, node_id: str, now: float) -> str | None:
        h = self._nodes.get(node_id)
        if h is None or h.ejected_until is None:
            return None
        return PROBING if h.probing or now >= h.ejected_until else EJECTED

    def reason(self, node_id: str) -> str:
        h = self._nodes.get(node_id)
        return h.reason if h is not None else ""

    # -- attempt outcomes -----------------------------------------------------------
    def record_success(self, node_id: str) -> None:
        h = self._nodes.get(node_id)
        if h is not None and h.ejected_until is None:
            h.connect_failures = h.http_failures = 0

    def record_failure(self, node_id: str, kind: str, now: float) -> bool:
        """Count a failed attempt; True when this failure ejected the node."""
        h = self._nodes.setdefault(node_id, _NodeHealth())
        if h.ejected_until is not None:
            return False
        if kind in CONNECT_KINDS:
            h.connect_failures += 1
            tripped = h.connect_failures >= self.config.consecutive_connect_failures
        else:
            h.http_failures += 1
            tripped = h.http_failures >= self.config.consecutive_5xx
        if not tripped or not self._enabled():
            return False
        self.ejections_total.labels(node_id, kind).inc()
        self._eject(node_id, h, kind, now)
        return True

    def _eject(self, node_id: str, h: _NodeHealth, reason: str, now: float) -> None:
        h.ejections += 1
        span = min(self.config.max_ejection_s, self.config.base_ejection_s * 2 ** (h.ejections - 1))
        h.ejected_until = now + span
        self._out = self._out | {node_id}
        h.reason = reason
        h.probing = False
        h.connect_failures = h.http_failures = 0
        log.log(
            logging.WARNING if h.ejections == 1 else logging.DEBUG,  # later: failed probes
            "node %s ejected (%s, ejection #%d): next probe in %.1fs",
            node_id,
            reason,
            h.ejections,
            span,
        )

    # -- re-admission probing ---------------------------------------------------------
    def due_probes(self, now: float) -> list[str]:
        """Ejected nodes whose ejection ended and that have no probe in flight (marked)."""
        due = []
        for node_id, h in self._nodes.items():
            if h.ejected_until is not None and not h.probing and now >= h.ejected_until:
                h.probing = True
                due.append(node_id)
        return due

    def next_probe_at(self) -> float | None:
        times = [
            h.ejected_until
            for h in self._nodes.values()
            if h.ejected_until is not None and not h.probing
        ]
        return min(times) if times else None

    def probe_result(self, node_id: str, ok: bool, now: float) -> None:
        h = self._nodes.get(node_id)
        if h is None or h.ejected_until is None:
            return
        self.probes_total.labels(node_id, "ok" if ok else "failed").inc()
        if ok:
            log.warning("node %s passed its probe: back in rotation", node_id)
            h.ejected_until, h.probing, h.ejections, h.reason = None, False, 0, ""
            self._out = self._out - {node_id}
        else:
            self._eject(node_id, h, h.reason or "probe", now)

    def forget(self, node_id: str) -> None:
        self._nodes.pop(node_id, None)
        self._out = self._out - {node_id}

    def snapshot(self, now: float) -> dict[str, dict[str, object]]:
        return {
            node_id: {
                "state": self.state(node_id, now),
                "reason": h.reason,
                "ejections": h.ejections,
                "ejected_for_s": None
                if h.ejected_until is None
                else round(max(0.0, h.ejected_until - now), 3),
            }
            for node_id, h in sorted(self._nodes.items())
            if h.ejected_until is not None
        }


class _EjectedCollector:
    def __init__(self, detector: OutlierDetector) -> None:
        self._detector = detector

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "kvgate_outlier_ejected",
            "1 while a node is out of rotation (ejected or awaiting a probe), by reason",
            labels=["node", "reason"],
        )
        for node_id in sorted(self._detector.ejected()):
            family.add_metric([node_id, self._detector.reason(node_id)], 1.0)
        yield family
