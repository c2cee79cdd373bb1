"""The dynamic total quota loop: one leader measures, decides and publishes; others follow.

``tick(now)`` runs every ``check_s`` (the gateway's loop, or the simulator in virtual
time). Once a period (``interval_s``) the replica holding the leader lease in the store
(``/kvgate/global/quota/leader``) observes KV use against measured capacity and the
watched class's admission → first-token latency against its target, applies
``QuotaRule`` (quota_rule.py) and publishes the total at ``/kvgate/global/quota/total``;
other replicas only read that key (they also watch it). Between period steps each tick
is a check: a *breach* (latency far over target since the last check) cuts the total at
once, and a raise is applied in parts (*ramp*) over the settle window so its admission
burst is spread. Bounds: the floor (guarantees, one mean request, ``min_total``) and the
ceiling (the absolute hard cap; the tighten watermark of measured KV capacity ×
overcommit, in reservation units: scaled by the measured held-runtime-tokens per
engine KV token, ``sharing.py``, while first tokens meet their target). Neither a breach
nor a tighten (the ceiling aside) shrinks the total while every eligible engine reports
headroom (``admission.headroom``). An optional forecast (``forecast(t)`` → runtime tokens
needed at time t, or None) pre-scales: the total is raised to it ahead of time (flag
``forecast``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvgate.admission.core import AdmissionCore
from kvgate.admission.quota_rule import Observation, QuotaRule
from kvgate.admission.sharing import SharingRatio
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
        # True while ``capacity`` is a calibrated knee (``kvgate calibrate``): the running
        # tokens at which latency met its SLO, already the operating point, so the ceiling
        # is the capacity itself rather than the tighten watermark of raw KV capacity
        self.calibrated: Callable[[], bool] | None = None
        self.forecast = forecast
        self.holder = holder or core.link.gateway_id
        dq = core.config.dynamic_quota
        self.rule = QuotaRule(
            tighten_above=dq.tighten_above,
            relax_below=dq.relax_below,
            max_step=dq.max_step,
            precision=dq.precision,
            memory=dq.memory_periods,
            decrease=dq.breach_decrease,
        )
        self.last: QuotaStep | None = None
        self.history: list[QuotaStep] = []
        self._since = float("-inf")
        self._checked = float("-inf")
        self._next_period: float | None = None
        self._ramp: tuple[int, int] | None = None  # (target, increment per check)
        self._refused_seen = 0
        self.sharing = SharingRatio()
        # the watched class's first tokens met their target at the last check: the engines
        # are not the bottleneck, so the ceiling may count a shared prefix once
        self._latency_ok = False
        self._holds_seen = 0

    def _measure_sharing(self) -> None:
        ledger = self.core.ledger
        self.sharing.observe(
            ledger.reserved_total, ledger.held_total - ledger.queued_prefill, ledger.engine_tokens()
        )
        metrics = self.core.metrics.quota_sharing
        metrics.labels("reserved").set(self.sharing.reserved_per_engine_token)
        metrics.labels("held").set(self.sharing.held_per_engine_token)

    async def tick(self, now: float) -> QuotaStep | None:
        """Called every ``check_s``: a full step once a period has passed, else a check
        (which cuts on a breach, or raises when the quota held work back while the engines
        had headroom). The first tick starts the first period."""
        interval = self.core.config.dynamic_quota.interval_s
        if self._next_period is None:
            self._next_period = now + interval
            self._since = self._checked = now
            return await self.check(now)
        if now >= self._next_period - 1e-9:
            self._next_period = now + interval
            return await self.step(now)
        return await self.check(now)

    async def check(self, now: float) -> QuotaStep | None:
        """Between period steps: cut at once when the watched class's first tokens since
        the last check are far over target (a period is too long to wait while an engine
        queue builds), else continue a raise in progress."""
        dq = self.core.config.dynamic_quota
        self._measure_sharing()
        since, self._checked = max(self._checked, self._since), now
        ttft, n = self.core.first_tokens.quantile(
            dq.ttft_class,
            dq.ttft_percentile,
            since,
            now=now,
            pending=self.core.ledger.waiting_first_token(dq.ttft_class),
        )
        ratio = None
        if ttft is not None and n >= max(1, dq.min_samples // 2):
            ratio = ttft / (dq.ttft_target_fraction * dq.ttft_slo_s)
        breach = ratio is not None and ratio > dq.breach_ratio
        if ratio is not None:
            self._latency_ok = ratio <= 1.0
        capacity = self.capacity() if self.capacity is not None else None
        _, ceiling = self._bounds(capacity)
        # between periods the ceiling only clamps once the shared-prefix ratio is measured:
        # before, a ceiling in reservation units is a guess that would cut a configured
        # total before any work arrived
        over = self.sharing.measured and ceiling is not None and self.core.total > ceiling
        if breach and not self.core.headroom.may_shrink("dynamic_quota"):
            breach = False
        # the quota held work back while every engine had room: raise now, not next period
        holds = self.core.headroom.quota_holds
        starved, self._holds_seen = holds > self._holds_seen, holds
        if not breach and self._ramp is None and not over and not starved:
            return None
        try:
            if not await self._lead():
                self._ramp = None
                return None
        except (StoreUnavailable, ConnectionError, OSError) as exc:
            self.core.link.mark(False, exc)
        previous = self.core.total
        if breach:
            assert ratio is not None
            self._ramp = None
            total, direction = self.rule.breach(previous, ratio).total, "breach"
            # what was admitted under the old total is not the new total's to answer for
            self._since = now
        elif over:
            self._ramp = None
            total, direction = self.core.total, "tighten"  # above the ceiling: clamp
        elif starved:
            self._ramp = None
            total, direction = int(previous * dq.max_step), "headroom"
        elif self._ramp is None:
            return None
        else:
            target, increment = self._ramp
            total, direction = min(target, previous + increment), "ramp"
            if total >= target:
                self._ramp = None
        capacity = self.capacity() if self.capacity is not None else None
        floor, ceiling = self._bounds(capacity)
        total = max(floor, total if ceiling is None else min(total, ceiling))
        if total == previous:
            return None
        self.core.book.set_total(total)
        self.core.metrics.dynamic_adjustments.labels(direction).inc()
        watermark = self.core.ledger.watermark()
        await self._publish(watermark)
        step = QuotaStep(
            now,
            previous,
            total,
            direction,
            watermark,
            capacity,
            ratio,
            ttft,
            self.core.ledger.reserved_total,
        )
        return self._record(step)

    async def _publish(self, watermark: int) -> None:
        try:
            await self.store.put(TOTAL_QUOTA, str(self.core.total))
            await self.store.put(WATERMARK, str(watermark))
        except (StoreUnavailable, ConnectionError, OSError) as exc:
            self.core.link.mark(False, exc)

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
        held_kv = int(held / self.sharing.held_per_engine_token)  # shared prefixes once
        kv = max(held_kv, self.core.ledger.engine_tokens() or 0)  # admitted work only
        kv_ratio = kv / capacity if capacity else None
        return Observation(self.core.total, kv_ratio, ttft_ratio, demand), ttft

    def _sharing_factor(self) -> float:
        """Held runtime tokens per engine KV token, while first tokens meet their target;
        1.0 (every reservation's prompt counted in full) while they do not."""
        return self.sharing.held_per_engine_token if self._latency_ok else 1.0

    def _bounds(self, capacity: int | None = None) -> tuple[int, int | None]:
        """Floor: guarantees, one mean request, ``min_total``. Ceiling: the absolute hard
        cap and, with measured KV capacity, the tighten watermark of it (× overcommit):
        reservations never undercount, so a total above that admits work the engines
        cannot hold at once — it only fills their queues."""
        cfg = self.core.config
        fixed = sum(q.guaranteed for q in self.core.book.quotas.values() if q.fraction is None)
        floor = max(cfg.dynamic_quota.min_total, fixed, int(self.core.ledger.mean_request_tokens()))
        ceiling = cfg.absolute_hard_cap
        if capacity:
            knee = self.calibrated is not None and self.calibrated()
            fraction = 1.0 if knee else cfg.dynamic_quota.tighten_above
            kv_cap = round(fraction * capacity * cfg.overcommit * self._sharing_factor())
            ceiling = kv_cap if ceiling is None else min(ceiling, kv_cap)
        return floor, None if ceiling is None else max(floor, ceiling)

    async def step(self, now: float) -> QuotaStep:
        dq = self.core.config.dynamic_quota
        previous = self.core.total
        watermark = self.core.ledger.watermark()
        capacity = self.capacity() if self.capacity is not None else None
        self._measure_sharing()
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
        if total < previous and not self.core.headroom.may_shrink("dynamic_quota"):
            total = previous  # the ceiling below still applies: it is what the engines hold
        floor, ceiling = self._bounds(capacity)
        total = max(floor, total if ceiling is None else min(total, ceiling))
        self._ramp = None
        if direction == "relax" and total > previous and self.rule.too_much is None:
            # a raise admits (total - previous) of waiting work at once: a prefill burst
            # the engines answer slowly. Spread it over the checks of the settle window.
            # (A raise bracketed by a too-much total is small and lands at once, so the
            # loop is in the band the period it decides to be.)
            checks = max(1, round(dq.settle_fraction * dq.interval_s / dq.check_s))
            increment = -(-(total - previous) // checks)
            if checks > 1:
                self._ramp = (total, increment)
                total = previous + increment
        if total != previous:
            self.core.book.set_total(total)
            self.core.metrics.dynamic_adjustments.labels(direction).inc()
        await self._publish(watermark)
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
