"""The dynamic total quota: a control loop over capacity, watermark, queue and request size.

Above the tighten watermark (default 80% of measured capacity) the total shrinks by one
step; below the relax watermark (50%) it grows when there is demand or room. It never
goes above the absolute hard cap, nor below what the guarantees and one mean request
need. ``step(now)`` is one iteration; the live controller calls it on a timer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvgate.admission.core import AdmissionCore
from kvgate.store import Store
from kvgate.store.base import StoreUnavailable
from kvgate.store.keys import TOTAL_QUOTA, WATERMARK


@dataclass(frozen=True, slots=True)
class QuotaStep:
    at: float
    previous: int
    total: int
    direction: str  # tighten | relax | hold
    watermark: int
    capacity: int


class DynamicQuota:
    def __init__(
        self,
        core: AdmissionCore,
        store: Store,
        capacity: Callable[[], int | None] | None = None,
    ) -> None:
        self.core = core
        self.store = store
        self.capacity = capacity
        self.last: QuotaStep | None = None

    def _capacity(self) -> int:
        measured = self.capacity() if self.capacity is not None else None
        return measured if measured else self.core.config.total_quota

    async def step(self, now: float) -> QuotaStep:
        cfg = self.core.config
        dq = cfg.dynamic_quota
        capacity = self._capacity()
        watermark = self.core.ledger.watermark()
        ratio = watermark / capacity if capacity > 0 else 1.0
        total = self.core.total
        demand = len(self.core.queue) > 0
        if ratio > dq.tighten_above:
            direction, proposed = "tighten", int(total * (1 - dq.step_fraction))
        elif ratio < dq.relax_below and (demand or total < capacity):
            direction, proposed = "relax", int(total * (1 + dq.step_fraction)) + 1
        else:
            direction, proposed = "hold", total
        mean_request = int(self.core.ledger.mean_request_tokens())
        floor = max(dq.min_total, sum(self.core.book.guarantees().values()), mean_request)
        ceiling = cfg.absolute_hard_cap or max(cfg.total_quota, capacity)
        new_total = max(floor, min(proposed, ceiling))
        if new_total != total:
            self.core.book.set_total(new_total)
            self.core.metrics.dynamic_adjustments.labels(direction).inc()
        try:
            await self.store.put(TOTAL_QUOTA, str(self.core.total))
            await self.store.put(WATERMARK, str(watermark))
        except (StoreUnavailable, ConnectionError, OSError) as exc:
            self.core.link.mark(False, exc)
        self.last = QuotaStep(now, total, self.core.total, direction, watermark, capacity)
        return self.last
