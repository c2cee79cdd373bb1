"""Explicit, metered over-admission: reserve up to total × ratio, reconciled every scrape.

Reservations cover each request's full output bound, so most of them are never filled;
an operator may let the cluster's reservations exceed the total by a configured ratio.
The excess is exported, and every scrape compares it with what the engines actually
hold: once engine-reported KV use reaches the total, over-admission stops (ratio 1.0)
until it falls back below ``resume_below`` of the total. A tenant's hard cap is never
overcommitted.
"""

from __future__ import annotations

import logging

from kvgate.admission.metrics import AdmissionMetrics

log = logging.getLogger("kvgate.admission")


class Overcommit:
    def __init__(self, ratio: float, metrics: AdmissionMetrics, resume_below: float = 0.8):
        self.configured = ratio
        self.effective = ratio
        self.resume_below = resume_below
        self._metrics = metrics
        metrics.overcommit_ratio.set(ratio)

    def total(self, total: int) -> int:
        """The cluster limit reservations are checked against."""
        return int(total * self.effective)

    def reconcile(self, total: int, reserved: int, engine_kv_tokens: int | None) -> float:
        """One reconciliation (each scrape); returns the effective ratio."""
        self._metrics.overcommit_excess.set(max(0, reserved - total))
        if self.configured <= 1.0:
            return self.effective
        if engine_kv_tokens is not None and engine_kv_tokens >= total:
            if self.effective > 1.0:
                log.warning(
                    "engines hold %d KV tokens >= total %d: over-admission paused",
                    engine_kv_tokens,
                    total,
                )
                self._metrics.overcommit_paused.inc()
            self.effective = 1.0
        elif engine_kv_tokens is None or engine_kv_tokens < self.resume_below * total:
            self.effective = self.configured
        self._metrics.overcommit_ratio.set(self.effective)
        return self.effective
