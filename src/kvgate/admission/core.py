"""AdmissionCore: the decisions, clock-injected and free of asyncio waits.

It composes small parts: the quota book (totals, guarantees, caps), the store link
(shared store + injected local fallback), the ledger (what each request reserved and
holds), the DRR queue, the overcommit meter and the release-rate estimate. Every method
is a coroutine only because the store is; with a memory store none of them suspends, so
the simulator drives them with ``kvgate.clock.run_now``. The live
``AdmissionController`` adds waiting (futures + timers) around it.

A reservation is prompt + the request's output bound (max_tokens, else the model's
default, clamped by its context) and never grows afterwards: a tenant's reserved tokens
cannot exceed its hard cap, nor the cluster's its total × the configured overcommit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvgate.admission.config import AdmissionConfig
from kvgate.admission.decisions import DecisionCounter
from kvgate.admission.first_tokens import FirstTokenWindow
from kvgate.admission.headroom import HeadroomGuard
from kvgate.admission.ledger import Ledger
from kvgate.admission.metrics import AdmissionMetrics
from kvgate.admission.overcommit import Overcommit
from kvgate.admission.prefill_gate import PrefillGate
from kvgate.admission.queue import AdmissionQueue, QueuedRequest
from kvgate.admission.quota import limits_at, max_admissible
from kvgate.admission.quota_book import QuotaBook
from kvgate.admission.release_rate import ReleaseRate
from kvgate.admission.snapshot import snapshot
from kvgate.admission.store_link import StoreLink
from kvgate.flags import Flags
from kvgate.store import ReserveOutcome, Store, open_store
from kvgate.types import AdmissionKind, AdmissionRequest, AdmissionResult, RejectReason

# reasons a fair-share limit (not a capacity limit) refused the reservation: degraded
# work (low priority, economy pool) may go past the share, never past a cap or the total
SHARE_LIMITS = frozenset({"tenant_share"})
# reasons the quota (not a tenant's hard cap) refused: counted when the engines had room
QUOTA_LIMITS = frozenset({"total", "elastic_pool", "tenant_share"})


@dataclass(slots=True)
class Ticket:
    """What an admitted request holds; passed back to progress() and release()."""

    request_id: str
    tenant: str
    reserved: int
    local: bool  # reserved in the local fallback store (shared store was down)
    priority_class: str = "interactive"
    admitted_at: float = 0.0
    first_token: bool = False
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
        headroom: Callable[[], bool] | None = None,
    ) -> None:
        """``headroom()``: every eligible engine reports room for more work
        (``pipeline.engine_usage.engines_have_headroom``); None: never assumed."""
        self.config = config
        self.flags = flags or Flags()
        self.metrics = metrics or AdmissionMetrics()
        self.book = QuotaBook(config, self.metrics)
        self.link = StoreLink(
            store,
            local_store if local_store is not None else open_store("memory://"),
            gateway_id=gateway_id,
            fail_closed=config.failure_mode == "fail-closed",
            metrics=self.metrics,
        )
        self.ledger = Ledger(engine_usage)
        self.queue = AdmissionQueue(
            max_tokens_per_tenant=config.queue.max_queue_tokens,
            quantum_tokens=config.queue.quantum_tokens,
            weight=lambda t: self.book.quota_for(t).weight,
            long_threshold=config.queue.long_request_threshold_tokens,
        )
        self.overcommit = Overcommit(config.overcommit, self.metrics)
        self.decisions = DecisionCounter(self.metrics)
        self.releases = ReleaseRate()
        self.first_tokens = FirstTokenWindow()
        self.headroom = HeadroomGuard(config.headroom, headroom, self.flags, self.metrics)
        self.gate = PrefillGate(
            config.prefill_gate,
            self.metrics,
            engines_idle=self.headroom.engines_have_room,
        )
        self.refused = 0  # requests queued or rejected: demand the total did not meet
        self._draining = False
        self._drain_again = False

    @property
    def store(self) -> Store:
        return self.link.store

    @property
    def total(self) -> int:
        return self.book.total

    # -- limits --------------------------------------------------------------------------
    async def _reserve(
        self, tenant: str, tokens: int, fair_share: bool = True
    ) -> tuple[ReserveOutcome, bool]:
        if self.book.guarantees_changed:
            self.book.guarantees_changed = False
            await self.link.publish_guarantees(self.book.guarantees())
        total = self.overcommit.total(self.book.total)
        local_total = max(1, int(total * self.config.local_share))
        limits = limits_at(
            self.book.quota_for(tenant),
            self.book.quotas,
            self.link.usage,
            self.queue,
            self.config.queue.long_request_reserved_fraction,
            tokens,
            fair_share=fair_share,
        )
        return await self.link.reserve(tenant, tokens, limits, total, local_total)

    # -- decisions -----------------------------------------------------------------------
    def _admitted(
        self,
        req: AdmissionRequest,
        tokens: int,
        outcome: ReserveOutcome,
        local: bool,
        waited: float,
        now: float,
        degrade_to: str | None = None,
    ) -> AdmissionResult:
        mode = degrade_to or "normal"
        self.ledger.open(
            req.request_id,
            req.tenant,
            req.prompt_tokens,
            tokens,
            mode,
            req.priority_class,
            now,
            req.stream,
        )
        self.gate.admitted(req.request_id, req.prompt_tokens, now, req.stream)
        ticket = Ticket(req.request_id, req.tenant, tokens, local, req.priority_class, now)
        reason = outcome.reason + ("_local" if local else "")
        kind = AdmissionKind.DEGRADE if degrade_to else AdmissionKind.ADMIT
        self.decisions.count(req.tenant, kind.value, reason)
        return AdmissionResult(
            kind,
            reason,
            queued_seconds=waited,
            reserved_tokens=tokens,
            output_bound=tokens - req.prompt_tokens,
            degrade_to=degrade_to,
            ticket=ticket,
        )

    def _reject(self, tenant: str, reason: RejectReason, **extra: Any) -> AdmissionResult:
        self.refused += 1
        self.decisions.count(tenant, "reject", reason.value)
        return AdmissionResult(AdmissionKind.REJECT, reason, **extra)

    async def try_admit(self, req: AdmissionRequest, now: float) -> AdmissionResult:
        """admit | queue (ticket = QueuedRequest) | reject | degrade, decided now.

        Async degraded work is queued like anything else and answered at once (kind
        DEGRADE, ticket = the QueuedRequest): the queue dispatches it when it fits.
        """
        self.releases.seen(now)
        bound = self.config.output.bound(req.model, req.prompt_tokens, req.max_tokens)
        if not self.flags.enabled("admission"):
            self.decisions.count(req.tenant, "admit", "admission_off")
            return AdmissionResult(AdmissionKind.ADMIT, "admission_off", output_bound=bound)
        tokens = req.prompt_tokens + bound
        quota = self.book.quota_for(req.tenant)
        if tokens > max_admissible(quota, self.overcommit.total(self.book.total)):
            return self._reject(req.tenant, RejectReason.TOO_LARGE, output_bound=bound)
        # a request that fits in what its tenant is guaranteed must be admitted at once
        claim = self.link.usage.get(req.tenant, 0) + tokens <= quota.guaranteed
        paced = self._paced(req, now)
        if paced:
            self.metrics.prefill_held.labels(req.priority_class).inc()
        reason = "prefill_gate" if paced else "queue_backlog"
        if not paced and not self.queue.has_backlog(req.tenant):  # keep each tenant FIFO
            outcome, local = await self._reserve_or_open(req.tenant, tokens, now)
            if outcome.ok:
                if claim:
                    self.metrics.guarantee_claims.labels(req.tenant, "honoured").inc()
                return self._admitted(req, tokens, outcome, local, 0.0, now)
            reason = outcome.reason
        if claim:
            # the gate only delays a claim (its tokens stay free for it); the quota refuses
            label = "paced" if paced else "refused"
            self.metrics.guarantee_claims.labels(req.tenant, label).inc()
        if reason == RejectReason.STORE_UNAVAILABLE:
            return self._reject(req.tenant, RejectReason.STORE_UNAVAILABLE, retry_after_s=1.0)
        mode = self._degrade_mode(req)
        if mode in ("low_priority", "economy_pool") and reason in SHARE_LIMITS:
            outcome, local = await self._reserve(req.tenant, tokens, fair_share=False)
            if outcome.ok:
                return self._admitted(req, tokens, outcome, local, 0.0, now, degrade_to=mode)
        if self.config.queue.max_queue_tokens > 0 and self.queue.can_accept(req.tenant, tokens):
            return self._enqueue(req, tokens, now, reason, "async" if mode == "async" else None)
        return self._reject(
            req.tenant,
            RejectReason.QUEUE_FULL,
            retry_after_s=self.releases.retry_after(
                self.queue.queued_tokens(req.tenant) + tokens,
                now,
                self.config.queue.default_deadline_s,
            ),
            output_bound=bound,
        )

    def _enqueue(
        self, req: AdmissionRequest, tokens: int, now: float, reason: str, degrade_to: str | None
    ) -> AdmissionResult:
        wait = (
            self.config.degrade.async_deadline_s
            if degrade_to == "async"
            else self.config.queue.deadline_for(req.priority_class)
        )
        deadline = now + wait
        shed_at = None if degrade_to == "async" else self._shed_at(req, tokens, now)
        item = QueuedRequest(
            req,
            tokens,
            enqueued_at=now,
            deadline=deadline if shed_at is None else min(deadline, shed_at),
            is_long=tokens >= self.queue.long_threshold,
            degrade_to=degrade_to,
            sheds=shed_at is not None and shed_at < deadline,
        )
        self.queue.push(item)
        self.refused += 1
        self.ledger.queued_prefill += req.prompt_tokens
        kind = AdmissionKind.DEGRADE if degrade_to else AdmissionKind.QUEUE
        self.decisions.count(req.tenant, kind.value, reason)
        self._update_queue_gauge(req.tenant)
        return AdmissionResult(
            kind,
            reason,
            output_bound=tokens - req.prompt_tokens,
            degrade_to=degrade_to,
            ticket=item,
        )

    async def _reserve_or_open(
        self, tenant: str, tokens: int, now: float
    ) -> tuple[ReserveOutcome, bool]:
        """Reserve; a quota refusal while the engines have room is counted (the dynamic
        quota loop answers it by raising the total)."""
        outcome, local = await self._reserve(tenant, tokens)
        if not outcome.ok and outcome.reason in QUOTA_LIMITS:
            self.headroom.note_hold(f"quota_{outcome.reason}", now)
        return outcome, local

    def _paced(self, req: AdmissionRequest, now: float) -> bool:
        """The prefill gate holds this request back (it waits in the queue)."""
        if not self.flags.enabled("prefill_gate"):
            return False
        if self.gate.allows(req.prompt_tokens, req.priority_class):
            return False
        return not self.headroom.overrule("prefill_gate", now)

    def _shed_at(self, req: AdmissionRequest, tokens: int, now: float) -> float | None:
        """When this request stops waiting if its tenant's queue stands (never empties)
        until then: work that waits longer in a saturated cluster misses its class's
        TTFT, and the client had better hear 429 and retry. The tenant's queue has been
        busy since ``backlog_since`` (now, if empty) and stays busy while this waits."""
        limit = self.config.queue.standing_wait_s.get(req.priority_class)
        if limit is None or not self.flags.enabled("queue_shedding"):
            return None
        if not self.headroom.engines_saturated():
            return None  # the queue stands by the tenants' quotas, not the engines' speed
        cap = self.book.quota_for(req.tenant).hard_cap
        if cap is not None and self.link.usage.get(req.tenant, 0) + tokens > cap:
            return None  # the tenant's own cap holds it: it waits its deadline, as configured
        since = self.queue.backlog_since(req.tenant)
        standing_at = (now if since is None else since) + self.config.queue.standing_after_s
        return max(standing_at, now + limit)

    def _degrade_mode(self, req: AdmissionRequest) -> str | None:
        if not self.flags.enabled("degrade"):
            return None
        d = self.config.degrade
        return d.modes.get(req.priority_class) or d.over_quota

    # -- the queue -----------------------------------------------------------------------
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
            if self._paced(item.request, now):
                return False
            outcome, local = await self._reserve_or_open(item.tenant, item.tokens, now)
            if not outcome.ok:
                return False
            if not self.queue.contains(item):  # expired or cancelled meanwhile: undo
                await self.link.give_back(item.tenant, item.tokens, local)
                return False
            self._dequeued(item, now, "admitted")
            item.outcome = self._admitted(
                item.request,
                item.tokens,
                outcome,
                local,
                now - item.enqueued_at,
                now,
                item.degrade_to,
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
        """Queued requests whose deadline passed (deadline <= now) → rejected, in ``outcome``."""
        expired = self.queue.expire(now)
        for item in expired:
            waited = now - item.enqueued_at
            if item.sheds:
                self._dequeued(item, now, "shed")
                item.outcome = self._reject(
                    item.tenant,
                    RejectReason.OVERLOADED,
                    queued_seconds=waited,
                    retry_after_s=self.config.queue.standing_after_s,
                )
            else:
                self._dequeued(item, now, "deadline")
                item.outcome = self._reject(
                    item.tenant, RejectReason.DEADLINE, queued_seconds=waited
                )
        return expired

    def cancel(self, item: QueuedRequest, now: float) -> None:
        """The waiting client went away: drop it from the queue."""
        if self.queue.remove(item):
            self._dequeued(item, now, "cancelled")

    # -- in flight -----------------------------------------------------------------------
    async def progress(
        self, result: AdmissionResult, generated_tokens: int, now: float | None = None
    ) -> list[QueuedRequest]:
        """Tokens generated so far; the reservation already covers the output bound.

        The first report (with ``now``) times admission → first token for the quota loop
        and frees the request's place in the prefill gate: queued work it held back is
        admitted and returned (as ``release`` does).
        """
        if self.progress_now(result, generated_tokens, now) and now is not None:
            return await self.drain(now)
        return []

    def progress_now(
        self, result: AdmissionResult, generated_tokens: int, now: float | None = None
    ) -> bool:
        """``progress`` without its drain: the bookkeeping, which needs no I/O. True when
        the report freed a prefill-gate place, so queued work must be drained (with
        ``now``) as ``progress`` does."""
        ticket = result.ticket
        if not isinstance(ticket, Ticket) or ticket.released:
            return False
        freed = False
        if now is not None and not ticket.first_token and generated_tokens > 0:
            ticket.first_token = True
            self.first_tokens.observe(now, ticket.priority_class, now - ticket.admitted_at)
            freed = self.gate.first_token(ticket.request_id, now)
        overrun = self.ledger.progress(ticket.request_id, generated_tokens)
        if overrun > 0:  # the engine ran past max_tokens: counted, never re-reserved
            self.metrics.bound_overrun.labels(ticket.tenant).inc(overrun)
        return freed and now is not None and self.flags.enabled("prefill_gate")

    async def release(self, result: AdmissionResult, now: float) -> list[QueuedRequest]:
        """Return the reservation, then admit what now fits (DRR order)."""
        ticket = result.ticket
        if not isinstance(ticket, Ticket) or ticket.released:
            return []
        ticket.released = True
        self.ledger.close(ticket.request_id)
        self.gate.closed(ticket.request_id)
        await self.link.give_back(ticket.tenant, ticket.reserved, ticket.local)
        self.releases.record(now, ticket.reserved)
        return await self.drain(now)

    # -- upkeep --------------------------------------------------------------------------
    async def refresh(self, ttl_s: float) -> None:
        """Heartbeat, reclaim dead gateways' tokens, reconcile overcommit, export gauges."""
        await self.link.upkeep(ttl_s, self.book.guarantees())
        self.reconcile()
        usage = await self.link.all_usage()
        for name in set(self.book.quotas) | set(usage):
            self.metrics.quota_used.labels(name).set(usage.get(name, 0))
        for (tenant, mode), tokens in self.ledger.reserved_by().items():
            self.metrics.reserved.labels(tenant, mode).set(tokens)
        self.metrics.watermark.set(self.ledger.watermark())

    def reconcile(self) -> float:
        """Compare reservations with engine-reported KV use (each scrape): overcommit."""
        reserved = sum(self.link.usage.values()) if self.link.up else self.ledger.reserved_total
        return self.overcommit.reconcile(self.book.total, reserved, self.ledger.engine_tokens())

    def snapshot(self) -> dict[str, Any]:
        return snapshot(self)
