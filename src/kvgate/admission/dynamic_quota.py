"""The dynamic total quota loop: one leader measures, decides and publishes; others follow.

Each period (``interval_s``) the replica holding the leader lease in the store
(``/kvgate/global/quota/leader``) observes KV use against measured capacity and the
watched class's admission → first-token latency against its target, applies
``QuotaRule`` (quota_rule.py), bounds the result by the floor (guarantees, one mean
request, ``min_total``) and the ceiling (the absolute hard cap), and publishes the total
at ``/kvgate/global/quota/total``. Other replicas only read that key (they also watch
it). An optional forecast (``forecast(t)`` → runtime tokens needed at time t, or None)
pre-scales: the total is raised to it ahead of time (flag ``forecast``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvgate.admission.core import AdmissionCore
from kvgate.admission.quota_rule import Observation, QuotaRule
from kvgate.store import Store
from kvgate.store.base import StoreUnavailable
from kvgate.store.keys import ROOT, TOTAL_QUOTA, WATERMARK

LEADER_KEY = f"{ROOT}/global/quota/leader"


@dataclass(frozen=True, slots=True)
class QuotaStep:
    at: float
    previous: int
    total: int
    direction: str  # tighten | relax | hold | follow | forecast
    watermark: int
    capacity: int | None
    pressure: float | None = None
    ttft_s: float | None = None  # the watched percentile over the period
    reserved: int = 0  # this replica's reserved runtime tokens at the step


class DynamicQuota:
    def __init__(
        self,
        core: AdmissionCore,
        store: Store,
        capacity: Callable[[], int | None] | None = None,
        *,
        holder: str | None = None,
        forecast: Callable[[float], float | None] | None = None,
    ) -> None:
        self.core = core
        self.store = store
        self.capacity = capacity
        self.forecast = forecast
        self.holder = holder or core.link.gateway_id
        dq = core.config.dynamic_quota
        self.rule = QuotaRule(
            tighten_above=dq.tighten_above,
            relax_below=dq.relax_below,
            max_step=dq.max_step,
            precision=dq.precision,
            memory=dq.memory_periods,
        )
        self.last: QuotaStep | None = None
        self.history: list[QuotaStep] = []
        self._since = float("-inf")
        self._refused_seen = 0

    async def _lead(self) -> bool:
        """Hold (or take over an expired) leader lease; False while another replica holds it."""
        ttl = 3 * self.core.config.dynamic_quota.interval_s
        current = await self.store.get(LEADER_KEY)
        if current not in (None, self.holder):
            return False
        await self.store.put(LEADER_KEY, self.holder, ttl=ttl)
        return True

    def _observe(
        self, now: float, capacity: int | None, watermark: int
    ) -> tuple[Observation, float | None]:
        dq = self.core.config.dynamic_quota
        ttft, n = self.core.first_tokens.quantile(
            dq.ttft_class,
            dq.ttft_percentile,
            self._since,
            dq.settle_fraction * dq.interval_s,
            now=now,
            pending=self.core.ledger.waiting_first_token(dq.ttft_class),
        )
        ttft_ratio = None
        if ttft is not None and n >= dq.min_samples:
            ttft_ratio = ttft / (dq.ttft_target_fraction * dq.ttft_slo_s)
        demand = self.core.refused > self._refused_seen or len(self.core.queue) > 0
        self._refused_seen, self._since = self.core.refused, now
        held = self.core.ledger.held_total - self.core.ledger.queued_prefill
        kv = max(held, self.core.ledger.engine_tokens() or 0)  # admitted work only
        kv_ratio = kv / capacity if capacity else None
        return Observation(self.core.total, kv_ratio, ttft_ratio, demand), ttft

    def _bounds(self) -> tuple[int, int | None]:
        cfg = self.core.config
        fixed = sum(q.guaranteed for q in self.core.book.quotas.values() if q.fraction is None)
        floor = max(cfg.dynamic_quota.min_total, fixed, int(self.core.ledger.mean_request_tokens()))
        return floor, cfg.absolute_hard_cap

    async def step(self, now: float) -> QuotaStep:
        previous = self.core.total
        watermark = self.core.ledger.watermark()
        capacity = self.capacity() if self.capacity is not None else None
        try:
            leader = await self._lead()
            if not leader:
                value = await self.store.get(TOTAL_QUOTA)
                if value is not None:
                    self.core.book.apply_store_value(TOTAL_QUOTA, value)
                return self._record(
                    QuotaStep(now, previous, self.core.total, "follow", watermark, capacity)
                )
        except (StoreUnavailable, ConnectionError, OSError) as exc:
            self.core.link.mark(False, exc)  # alone: decide locally, publish when back
        obs, ttft = self._observe(now, capacity, watermark)
        move = self.rule.next_total(obs)
        total, direction = move.total, move.direction
        if self.forecast is not None and self.core.flags.enabled("forecast"):
            wanted = self.forecast(now + self.core.config.dynamic_quota.interval_s)
            if wanted is not None and wanted > total:
                total, direction = int(wanted), "forecast"
        floor, ceiling = self._bounds()
        total = max(floor, total if ceiling is None else min(total, ceiling))
        if total != previous:
            self.core.book.set_total(total)
            self.core.metrics.dynamic_adjustments.labels(direction).inc()
        try:
            await self.store.put(TOTAL_QUOTA, str(self.core.total))
            await self.store.put(WATERMARK, str(watermark))
        except (StoreUnavailable, ConnectionError, OSError) as exc:
            self.core.link.mark(False, exc)
        step = QuotaStep(
            now,
            previous,
            self.core.total,
            direction if self.core.total != previous else "hold",
            watermark,
            capacity,
            move.pressure,
            ttft,
            self.core.ledger.reserved_total,
        )
        return self._record(step)

    def _record(self, step: QuotaStep) -> QuotaStep:
        self.core.metrics.quota_leader.set(0 if step.direction == "follow" else 1)
        if step.pressure is not None:
            self.core.metrics.quota_pressure.set(step.pressure)
        self.last = step
        self.history.append(step)
        del self.history[:-2000]
        return step
