"""AdmissionCore: the decision logic, clock-injected and free of asyncio waits.

Every method is a coroutine only because the store is; with ``MemoryStore`` none of them
suspends, so the simulator drives them with ``kvgate.clock.run_now``. The live
``AdmissionController`` adds waiting (futures + timers) around it.
"""

from __future__ import annotations

import json
import logging
import math
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from kvgate.admission.config import AdmissionConfig
from kvgate.admission.ledger import Ledger
from kvgate.admission.metrics import AdmissionMetrics
from kvgate.admission.queue import AdmissionQueue, QueuedRequest
from kvgate.admission.quota import TenantQuota, max_admissible, reserve_limits
from kvgate.flags import Flags
from kvgate.store import ReserveLimits, ReserveOutcome, Store, open_store
from kvgate.store.base import StoreUnavailable
from kvgate.types import AdmissionKind, AdmissionRequest, AdmissionResult

log = logging.getLogger("kvgate.admission")

RATE_WINDOW_S = 30.0
MAX_RETRY_AFTER_S = 60.0


@dataclass(slots=True)
class Ticket:
    """What an admitted request holds; passed back to release()."""

    request_id: str
    tenant: str
    reserved: int
    local: bool  # reserved in the local fallback store (shared store was down)
    released: bool = False


class AdmissionCore:
    def __init__(
        self,
        config: AdmissionConfig,
        store: Store,
        *,
        flags: Flags | None = None,
        gateway_id: str = "gw",
        metrics: AdmissionMetrics | None = None,
        engine_usage: Callable[[], int | None] | None = None,
        local_store: Store | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.flags = flags or Flags()
        self.gateway_id = gateway_id
        self.metrics = metrics or AdmissionMetrics()
        self.quotas: dict[str, TenantQuota] = {
            t.name: TenantQuota.from_config(t) for t in config.tenants
        }
        self.total = config.total_quota
        self.ledger = Ledger(config.output_percentile, config.output_window, engine_usage)
        self.queue = AdmissionQueue(
            max_tokens_per_tenant=config.queue.max_queue_tokens,
            quantum_tokens=config.queue.quantum_tokens,
            weight=lambda t: self.quota_for(t).weight,
        )
        self.store_up = True
        # the fallback that counts locally while the shared store is down (injected)
        self._local = local_store if local_store is not None else open_store("memory://")
        self.usage_cache: dict[str, int] = {}
        self._releases: deque[tuple[float, int]] = deque()
        self._first_seen: float | None = None
        self._draining = False
        self._drain_again = False
        self._unreturned: dict[str, int] = {}  # releases the store missed while down
        self.decision_counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.metrics.quota_total.set(self.total)
        for q in self.quotas.values():
            self.metrics.quota_guaranteed.labels(q.name).set(q.guaranteed)

    # -- quota state -------------------------------------------------------------------
    def quota_for(self, tenant: str) -> TenantQuota:
        q = self.quotas.get(tenant)
        if q is None:
            q = self.quotas[tenant] = TenantQuota(tenant, 0, 1.0, None)
        return q

    def set_total(self, total: int) -> None:
        cap = self.config.absolute_hard_cap
        self.total = max(1, min(total, cap) if cap is not None else total)
        self.metrics.quota_total.set(self.total)

    def apply_store_value(self, key: str, value: str | None) -> bool:
        """Apply a /kvgate/global/quota/total or /kvgate/tenant/<name>/quota value."""
        from kvgate.store.keys import TENANTS_PREFIX, TOTAL_QUOTA

        try:
            if key == TOTAL_QUOTA and value is not None:
                self.set_total(int(float(value)))
                return True
            if key.startswith(TENANTS_PREFIX) and key.endswith("/quota") and value is not None:
                name = key[len(TENANTS_PREFIX) : -len("/quota")]
                data: dict[str, Any] = json.loads(value)
                q = self.quota_for(name)
                q.guaranteed = int(data.get("guaranteed", q.guaranteed))
                q.weight = float(data.get("weight", q.weight))
                cap = data.get("hard_cap", q.hard_cap)
                q.hard_cap = None if cap is None else int(cap)
                self.metrics.quota_guaranteed.labels(name).set(q.guaranteed)
                return True
        except (ValueError, TypeError) as exc:
            log.warning("ignoring bad quota value at %s: %s", key, exc)
        return False

    def guarantees(self) -> dict[str, int]:
        return {n: q.guaranteed for n, q in self.quotas.items()}

    # -- decisions ---------------------------------------------------------------------
    def _count(self, tenant: str, kind: str, reason: str) -> None:
        self.decision_counts[kind][reason] += 1
        self.metrics.decisions.labels(tenant, kind, reason).inc()

    def _is_long(self, tokens: int) -> bool:
        return tokens >= self.config.queue.long_request_threshold_tokens

    def _limits(self, tenant: TenantQuota, tokens: int, total: int) -> ReserveLimits:
        limits = reserve_limits(
            tenant,
            total=total,
            quotas=self.quotas,
            usage=self.usage_cache,
            waiting=self.queue.waiting_tenants(),
            request_tokens=tokens,
        )
        if self._is_long(tokens):
            return limits
        # keep room for long requests: a reserved fraction while one waits, its full
        # size once it is due, so a flood of short requests cannot starve it
        held_back = 0
        if self.queue.long_waiting():
            held_back = int(self.config.queue.long_request_reserved_fraction * total)
        if self.queue.due_long is not None:
            held_back = max(held_back, self.queue.due_long.tokens)
        if held_back:
            limits = replace(limits, elastic_pool=max(0, limits.elastic_pool - held_back))
        return limits

    async def _reserve(self, tenant: str, tokens: int) -> tuple[ReserveOutcome, bool]:
        """(outcome, local): reserve in the shared store, else per the failure mode."""
        quota = self.quota_for(tenant)
        if self.store_up:
            try:
                outcome = await self.store.reserve(
                    self.gateway_id, tenant, tokens, self._limits(quota, tokens, self.total)
                )
                return outcome, False
            except (StoreUnavailable, ConnectionError, OSError) as exc:
                self.mark_store(False, exc)
        if self.config.failure_mode == "fail-closed":
            return ReserveOutcome(False, "store_unavailable"), False
        local_total = max(1, int(self.total * self.config.local_share))
        outcome = await self._local.reserve(
            self.gateway_id, tenant, tokens, self._limits(quota, tokens, local_total)
        )
        return outcome, True

    def mark_store(self, up: bool, error: BaseException | None = None) -> None:
        if up == self.store_up:
            return
        self.store_up = up
        self.metrics.store_up.set(1 if up else 0)
        if up:
            log.warning("store %s reachable again: global accounting resumed", self.store.url)
        else:
            log.warning(
                "store %s unreachable (%s): %s",
                self.store.url,
                type(error).__name__ if error else "error",
                "serving on the local quota share"
                if self.config.failure_mode == "fail-open-local"
                else "rejecting (fail-closed)",
            )

    def _admitted(
        self,
        req: AdmissionRequest,
        tokens: int,
        outcome: ReserveOutcome,
        local: bool,
        waited: float,
    ) -> AdmissionResult:
        self.ledger.open(req.request_id, req.tenant, req.prompt_tokens, tokens)
        ticket = Ticket(req.request_id, req.tenant, tokens, local)
        if not local:
            self.usage_cache[req.tenant] = self.usage_cache.get(req.tenant, 0) + tokens
        reason = outcome.reason + ("_local" if local else "")
        self._count(req.tenant, "admit", reason)
        return AdmissionResult(
            AdmissionKind.ADMIT,
            reason,
            queued_seconds=waited,
            reserved_tokens=tokens,
            ticket=ticket,
        )

    async def try_admit(self, req: AdmissionRequest, now: float) -> AdmissionResult:
        """admit | queue (ticket = QueuedRequest) | reject | degrade, decided now."""
        if self._first_seen is None:
            self._first_seen = now
        if not self.flags.enabled("admission"):
            self._count(req.tenant, "admit", "admission_off")
            return AdmissionResult(AdmissionKind.ADMIT, "admission_off")
        quota = self.quota_for(req.tenant)
        tokens = self.ledger.reservation_for(req.tenant, req.prompt_tokens, req.max_tokens)
        if tokens > max_admissible(quota, self.total):
            self._count(req.tenant, "reject", "too_large")
            return AdmissionResult(AdmissionKind.REJECT, "too_large", status=413)
        reason = "queue_backlog"
        if not self.queue.has_backlog(req.tenant):  # keep each tenant's queue FIFO
            outcome, local = await self._reserve(req.tenant, tokens)
            if outcome.ok:
                return self._admitted(req, tokens, outcome, local, 0.0)
            reason = outcome.reason
            if reason == "store_unavailable":
                self._count(req.tenant, "reject", reason)
                return AdmissionResult(AdmissionKind.REJECT, reason, status=503, retry_after_s=1.0)
        mode = self._degrade_mode(req)
        if mode is not None:
            self._count(req.tenant, "degrade", reason)
            return AdmissionResult(AdmissionKind.DEGRADE, reason, degrade_to=mode)
        if self.config.queue.max_queue_tokens > 0 and self.queue.can_accept(req.tenant, tokens):
            item = QueuedRequest(
                req,
                tokens,
                enqueued_at=now,
                deadline=now + self.config.queue.deadline_for(req.priority_class),
                is_long=self._is_long(tokens),
            )
            self.queue.push(item)
            self.ledger.queued_prefill += req.prompt_tokens
            self._count(req.tenant, "queue", reason)
            self._update_queue_gauge(req.tenant)
            return AdmissionResult(AdmissionKind.QUEUE, reason, ticket=item)
        self._count(req.tenant, "reject", "queue_full")
        return AdmissionResult(
            AdmissionKind.REJECT,
            "queue_full",
            status=429,
            retry_after_s=self.retry_after(req.tenant, tokens, now),
        )

    def _degrade_mode(self, req: AdmissionRequest) -> str | None:
        if not self.flags.enabled("degrade"):
            return None
        d = self.config.degrade
        return d.modes.get(req.priority_class) or d.over_quota

    async def drain(self, now: float) -> list[QueuedRequest]:
        """Admit whatever now fits, in DRR order; each item's ``outcome`` is its result.

        One drain runs at a time: a call made while one is in progress (a store call
        suspended it) asks it to go round again and returns nothing; the running one
        returns everything it admitted.
        """
        if not len(self.queue):
            return []
        if self._draining:
            self._drain_again = True
            return []
        self._draining = True
        admitted: list[QueuedRequest] = []
        try:
            while True:
                self._drain_again = False
                admitted += await self._drain_once(now)
                if not self._drain_again:
                    return admitted
        finally:
            self._draining = False

    async def _drain_once(self, now: float) -> list[QueuedRequest]:
        async def attempt(item: QueuedRequest) -> bool:
            outcome, local = await self._reserve(item.tenant, item.tokens)
            if not outcome.ok:
                return False
            if not self.queue.contains(item):  # expired or cancelled meanwhile: undo
                store: Store = self._local if local else self.store
                await store.release(self.gateway_id, item.tenant, item.tokens)
                return False
            self._dequeued(item, now, "admitted")
            item.outcome = self._admitted(
                item.request, item.tokens, outcome, local, now - item.enqueued_at
            )
            return True

        return await self.queue.drain(attempt)

    def _dequeued(self, item: QueuedRequest, now: float, outcome: str) -> None:
        self.ledger.queued_prefill -= item.request.prompt_tokens
        self.metrics.queue_wait.labels(item.tenant, outcome).observe(now - item.enqueued_at)
        self._update_queue_gauge(item.tenant)

    def _update_queue_gauge(self, tenant: str) -> None:
        self.metrics.queue_depth.labels(tenant).set(self.queue.depth(tenant))

    def expire(self, now: float) -> list[QueuedRequest]:
        """Queued requests whose deadline passed (deadline <= now) → 408, in ``outcome``."""
        expired = self.queue.expire(now)
        for item in expired:
            self._dequeued(item, now, "deadline")
            self._count(item.tenant, "reject", "deadline")
            item.outcome = AdmissionResult(
                AdmissionKind.REJECT,
                "deadline",
                queued_seconds=now - item.enqueued_at,
                status=408,
            )
        return expired

    def cancel(self, item: QueuedRequest, now: float) -> None:
        """The waiting client went away: drop it from the queue."""
        if self.queue.remove(item):
            self._dequeued(item, now, "cancelled")

    def next_deadline(self) -> float | None:
        return self.queue.next_deadline()

    async def progress(self, result: AdmissionResult, generated_tokens: int) -> None:
        ticket = result.ticket
        if not isinstance(ticket, Ticket) or ticket.released:
            return
        grow = self.ledger.progress(ticket.request_id, generated_tokens)
        if grow > 0:
            ticket.reserved += grow
            if not ticket.local:
                self.usage_cache[ticket.tenant] = self.usage_cache.get(ticket.tenant, 0) + grow
            await self._store_call(ticket, "adjust", grow)

    async def release(self, result: AdmissionResult, now: float) -> list[QueuedRequest]:
        """Return the reservation, then admit what now fits (DRR order)."""
        ticket = result.ticket
        if not isinstance(ticket, Ticket) or ticket.released:
            return []
        ticket.released = True
        self.ledger.close(ticket.request_id)
        await self._store_call(ticket, "release", ticket.reserved)
        if not ticket.local:
            left = self.usage_cache.get(ticket.tenant, 0) - ticket.reserved
            self.usage_cache[ticket.tenant] = max(0, left)
        self._record_release(now, ticket.reserved)
        return await self.drain(now)

    async def _store_call(self, ticket: Ticket, op: str, tokens: int) -> None:
        store: Store = self._local if ticket.local else self.store
        try:
            await getattr(store, op)(self.gateway_id, ticket.tenant, tokens)
        except (StoreUnavailable, ConnectionError, OSError) as exc:
            self.mark_store(False, exc)
            if op == "release":
                # replayed on recovery (bounded by what we hold, so harmless if the store
                # restarted empty); otherwise our live lease would keep these tokens
                self._unreturned[ticket.tenant] = self._unreturned.get(ticket.tenant, 0) + tokens

    async def _replay_releases(self) -> None:
        while self._unreturned:
            tenant, tokens = next(iter(self._unreturned.items()))
            await self.store.release(self.gateway_id, tenant, tokens)
            del self._unreturned[tenant]

    # -- drain-rate estimate (Retry-After) --------------------------------------------
    def _record_release(self, now: float, tokens: int) -> None:
        self._releases.append((now, tokens))
        while self._releases and self._releases[0][0] < now - RATE_WINDOW_S:
            self._releases.popleft()

    def release_rate(self, now: float) -> float:
        """Tokens released per second over the recent window."""
        while self._releases and self._releases[0][0] < now - RATE_WINDOW_S:
            self._releases.popleft()
        if not self._releases or self._first_seen is None:
            return 0.0
        span = max(1.0, now - max(now - RATE_WINDOW_S, self._first_seen))
        return sum(t for _, t in self._releases) / span

    def retry_after(self, tenant: str, tokens: int, now: float) -> float:
        rate = self.release_rate(now)
        self.metrics.release_rate.set(rate)
        if rate <= 0:
            return min(MAX_RETRY_AFTER_S, self.config.queue.default_deadline_s)
        backlog = self.queue.queued_tokens(tenant) + tokens
        return float(min(MAX_RETRY_AFTER_S, max(1.0, math.ceil(backlog / rate))))

    # -- upkeep ------------------------------------------------------------------------
    async def refresh(self, ttl_s: float) -> None:
        """Heartbeat the lease, reclaim expired gateways' tokens, refresh usage gauges."""
        try:
            if self._unreturned and not await self.store.has_lease(self.gateway_id):
                self._unreturned.clear()  # the store lost or reaped what we held
            await self.store.heartbeat(self.gateway_id, ttl_s)
            if not self.store_up:
                await self.store.set_guarantees(self.guarantees())
            await self._replay_releases()
            reclaimed = await self.store.reap()
            if reclaimed:
                self.metrics.reclaimed.inc(reclaimed)
                log.warning("reclaimed %d tokens from expired gateway leases", reclaimed)
            self.usage_cache = await self.store.usage()
            self.mark_store(True)
        except (StoreUnavailable, ConnectionError, OSError) as exc:
            self.mark_store(False, exc)
        usage = dict(self.usage_cache) if self.store_up else {}
        for tenant, used in (await self._local.usage()).items():
            usage[tenant] = usage.get(tenant, 0) + used
        for name in set(self.quotas) | set(usage):
            self.metrics.quota_used.labels(name).set(usage.get(name, 0))
        self.metrics.watermark.set(self.ledger.watermark())

    def snapshot(self) -> dict[str, Any]:
        usage = {t: u for t, u in self.usage_cache.items() if u}
        tenants = {
            name: {
                "guaranteed": q.guaranteed,
                "weight": q.weight,
                "hard_cap": q.hard_cap,
                "used": usage.get(name, 0),
                "queue_depth": self.queue.depth(name),
                "queued_tokens": self.queue.queued_tokens(name),
            }
            for name, q in sorted(self.quotas.items())
        }
        return {
            "enabled": self.flags.enabled("admission"),
            "total_quota": self.total,
            "used": sum(usage.values()),
            "local_reserved": self.ledger.reserved_total,
            "runtime_tokens": self.ledger.held_total,
            "watermark": self.ledger.watermark(),
            "in_flight": len(self.ledger),
            "queue_depth": len(self.queue),
            "tenants": tenants,
            "decisions_total": {k: dict(v) for k, v in self.decision_counts.items()},
            "store": {"url": self.store.url, "up": self.store_up},
        }
