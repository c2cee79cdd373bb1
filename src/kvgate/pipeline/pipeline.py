"""RequestPipeline: every decision a request meets between arrival and its answer.

admit → (degrade applied to the route) → route with exclusions → dispatch → progress* →
complete or fail → retry within the retry budget → release. The pipeline owns the
decisions and the feedback (router, admission, outlier detector, retry budget); its two
drivers own only the I/O and the waiting:

* the gateway's proxy (``kvgate.gateway.proxy``) sends bytes to real engines, in asyncio;
* the cluster simulator (``kvgate.sim.cluster``) hands requests to ``EngineCore`` objects
  in virtual time, driving the coroutines with ``kvgate.clock.run_now``.

A driver calls, per request: ``start`` → ``admit`` (or ``accept`` for a result decided
later, e.g. a queued request) → per attempt ``next_attempt`` then ``attempt_failed`` or
``attempt_done`` → ``progress`` while tokens flow → ``release``. ``next_attempt`` raises
``GiveUp`` when no (further) attempt may be made; the driver answers with its status.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from kvgate.admission.queue import QueuedRequest
from kvgate.clock import Clock
from kvgate.flags import Flags
from kvgate.pipeline.config import PipelineConfig
from kvgate.pipeline.metrics import PipelineMetrics
from kvgate.pipeline.retry_budget import RetryBudget
from kvgate.routing.outlier import OutlierDetector
from kvgate.types import (
    AdmissionKind,
    AdmissionRequest,
    AdmissionResult,
    NodeReport,
    NodeState,
    NoNodeAvailable,
    RouteDecision,
    RouteRequest,
)

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from kvgate.routing.router import Router
    from kvgate.tracing import FlowTrace, Tracing

DEFAULT_POOL = "default"
# Answers an engine gives when it cannot take the request now (not about the request).
RETRYABLE_STATUSES = frozenset({502, 503, 504})


# Failures that say the node is gone (refused, reset as it died, removed), not that the
# cluster is overloaded: retrying them elsewhere adds no load that the dead node would not
# have taken, so the retry budget (a guard against retry storms) does not count them.
NODE_GONE_FAILURES = frozenset({"connect", "disconnected", "node_removed"})


# Called once per admission answer with the time the request arrived (before any queue
# wait), the request and the answer (e.g. kvgate.forecast's arrival samples).
ArrivalObserver = Callable[[float, AdmissionRequest, AdmissionResult], None]


def retryable_status(status: int) -> bool:
    return status in RETRYABLE_STATUSES


class Admission(Protocol):
    """What the pipeline needs of the quota layer (AdmissionController, VirtualAdmission)."""

    async def admit(self, req: AdmissionRequest) -> AdmissionResult: ...

    async def progress(self, result: AdmissionResult, generated_tokens: int) -> None: ...

    def progress_nowait(
        self, result: AdmissionResult, generated_tokens: int
    ) -> Coroutine[Any, Any, None] | None: ...

    async def release(self, result: AdmissionResult) -> None: ...


@dataclass(frozen=True, slots=True)
class Failure:
    """One attempt that failed before anything reached the client."""

    kind: str  # connect | disconnected | read | timeout | http_5xx | node_removed | …
    message: str
    status: int = 502  # what the client gets if this is the last failure
    retryable: bool = True


@dataclass(slots=True)
class AttemptOutcome:
    """How an attempt the node answered ended (``Failure``'s counterpart)."""

    ok: bool = False  # a success; else an error about the request, or a client that left
    cached_tokens: int | None = None  # the engine's actual cached prompt tokens
    output_tokens: int = 0
    broken: str | None = None  # the node failed after the client got bytes
    status: int | None = None  # the engine's HTTP status (traces)


class GiveUp(Exception):
    """No (further) attempt may be made; answer the client with ``status``."""

    def __init__(
        self, status: int, code: str, message: str, *, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.retry_after_s = retry_after_s


@dataclass(slots=True)
class Flow:
    """One request's way through the pipeline."""

    route: RouteRequest  # built once, with the resolved model; only pool/priority change
    admission_request: AdmissionRequest | None = None
    priority_min: int = 0  # the lowest priority the tenant may be degraded to
    wants_async: bool = False
    admission: AdmissionResult | None = None
    decision: RouteDecision | None = None
    tried: list[str] = field(default_factory=list)
    ineligible: frozenset[str] = frozenset()  # nodes this request may not go to (a subset hint)
    attempts: int = 0
    last_failure: Failure | None = None
    holds_reservation: bool = False
    run_async: bool = False  # answer 202 and run as a job (Prefer: respond-async / degrade)
    trace: FlowTrace | None = None  # the stage spans, when tracing is on and this is sampled
    upstream_traceparent: str | None = None  # sent to the engine (W3C trace context)

    @property
    def request_id(self) -> str:
        return self.route.request_id


class RequestPipeline:
    def __init__(
        self,
        *,
        router: Router,
        admission: Admission | None,
        flags: Flags,
        clock: Clock,
        max_retries: int,
        config: PipelineConfig | None = None,
        economy_pool: str = "economy",
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.config = config or PipelineConfig()
        self.router = router
        self.admission = admission
        self.flags = flags
        self.clock = clock
        self.max_retries = max_retries
        self.economy_pool = economy_pool
        self.metrics = PipelineMetrics(registry)
        budget = self.config.retry_budget
        self.budget = RetryBudget(
            ratio=budget.ratio, window_s=budget.window_s, min_retries=budget.min_retries
        )
        self.outlier = OutlierDetector(
            self.config.outlier,
            enabled=lambda: self.flags["outlier_detection"],
            registry=registry,
        )
        self._pools: frozenset[str] | None = None  # node pools, re-read when nodes change
        self.arrival_observers: list[ArrivalObserver] = []
        self.tracing: Tracing | None = None  # set by a driver that traces (kvgate.tracing)
        router.nodes.subscribe(
            on_add=self._nodes_changed,
            on_remove=self._nodes_changed,
            on_reregister=self._node_restarted,
            on_report=self._node_reported,
        )
        # an ejected node reads as backoff in the node view (kvgate_node_state, summary)
        router.nodes.overlay = self._ejected_state

    # -- admission -----------------------------------------------------------------------
    def start(
        self,
        route: RouteRequest,
        admission_request: AdmissionRequest | None = None,
        *,
        priority_min: int = 0,
        wants_async: bool = False,
        traceparent: str | None = None,
    ) -> Flow:
        """A new flow; ``traceparent``: the request span's, when tracing sampled it."""
        self.budget.record_request(self.clock.now())
        flow = Flow(route, admission_request, priority_min=priority_min, wants_async=wants_async)
        if traceparent is not None and self.tracing is not None:
            flow.trace = self.tracing.flow_trace(traceparent)
        return flow

    async def admit(self, flow: Flow) -> AdmissionResult:
        """Ask admission; a final answer is applied at once (a QUEUE one by ``accept`` later)."""
        assert self.admission is not None and flow.admission_request is not None
        arrived = self.clock.now()
        trace = flow.trace
        span = trace.start("kvgate.admission") if trace is not None else None
        try:
            result = await self.admission.admit(flow.admission_request)
        except asyncio.CancelledError:  # the client left while its request was queued
            self.metrics.cancellations.labels("queued").inc()
            if trace is not None and span is not None:
                trace.admitted(span, None)
            raise
        if trace is not None and span is not None:
            trace.admitted(span, result)
        for observe in self.arrival_observers:
            observe(arrived, flow.admission_request, result)
        if result.kind is AdmissionKind.QUEUE:
            flow.admission = result
        else:
            self.accept(flow, result)
        return result

    def accept(self, flow: Flow, result: AdmissionResult | None) -> None:
        """Apply a final admission result (None: admission is not in use) to the flow."""
        flow.admission = result
        flow.holds_reservation = (
            result is not None
            and result.kind in (AdmissionKind.ADMIT, AdmissionKind.DEGRADE)
            # async work answers 202 at once but waits in the admission queue: it holds
            # nothing until its turn comes (the driver accepts the final result then)
            and not isinstance(result.ticket, QueuedRequest)
        )
        route = flow.route
        if self._has_pool(DEFAULT_POOL) and self._has_pool(self.economy_pool):
            route.pool = DEFAULT_POOL  # economy nodes take degraded work only
        mode = result.degrade_to if result is not None else None
        if result is not None and result.kind is AdmissionKind.DEGRADE and mode is not None:
            if mode == "economy_pool":
                route.pool = self.economy_pool
            elif mode == "low_priority":
                route.priority = min(route.priority, flow.priority_min)
            self.metrics.degraded.labels(mode).inc()
        flow.run_async = flow.wants_async or mode == "async"

    def _has_pool(self, pool: str) -> bool:
        if self._pools is None:
            self._pools = frozenset(e.spec.pool for e in self.router.nodes.entries())
        return pool in self._pools

    def _nodes_changed(self, node_id: str) -> None:
        self._pools = None

    # -- what the node view tells the outlier detector -----------------------------------
    def _ejected_state(self, node_id: str) -> NodeState | None:
        return NodeState.BACKOFF if node_id in self.outlier.ejected() else None

    def _node_restarted(self, node_id: str) -> None:
        self.outlier.restarted(node_id, self.clock.now())

    def _node_reported(self, node_id: str, report: NodeReport, dispatched_since: int) -> None:
        self.outlier.report_seen(node_id, fresh=not report.stale, now=self.clock.now())

    # -- attempts ------------------------------------------------------------------------
    def next_attempt(self, flow: Flow) -> RouteDecision:
        """Route the flow's next attempt and count its dispatch; GiveUp when none may be."""
        now = self.clock.now()
        last = flow.last_failure
        if flow.attempts:
            assert last is not None, "a retry follows a failure"
            if not last.retryable or not self.flags["retries"]:
                raise self._give_up(flow)
            if flow.attempts > self.max_retries:
                raise self._give_up(flow)
            if (
                self.flags["retry_budget"]
                and last.kind not in NODE_GONE_FAILURES
                and not self.budget.try_spend(now)
            ):
                self.metrics.retry_budget_exhausted.inc()
                raise self._give_up(flow)
        trace = flow.trace
        if trace is None:
            decision = self._route(flow)
        else:
            span = trace.start("kvgate.routing", **{"kvgate.attempt": flow.attempts + 1})
            try:
                decision = self._route(flow)
            except GiveUp as stop:
                trace.routed(span, None, str(stop))
                raise
            trace.routed(span, decision, None)
        if last is not None:
            self.metrics.retries.labels(last.kind).inc()
        flow.tried.append(decision.node_id)
        flow.attempts += 1
        flow.decision = decision
        if trace is not None:
            entry = self.router.nodes.get(decision.node_id)
            url = entry.spec.url if entry is not None else None
            flow.upstream_traceparent = trace.attempt_started(decision, flow.attempts, url)
        self.router.on_dispatch(flow.route, decision)
        metrics = self.metrics
        metrics.child(metrics.dispatches, decision.node_id, decision.reason).inc()
        return decision

    def _route(self, flow: Flow) -> RouteDecision:
        ejected = self.outlier.ejected()
        try:
            return self.router.route(flow.route, exclude=ejected.union(flow.tried, flow.ineligible))
        except NoNodeAvailable as exc:
            error = exc
        if not flow.attempts and ejected:
            # every eligible node is ejected: a first try still goes to one of them
            # rather than failing the request outright (Envoy's panic mode)
            try:
                return self.router.route(flow.route, exclude=flow.ineligible.union(flow.tried))
            except NoNodeAvailable as exc:
                error = exc
        raise self._give_up(flow, str(error))

    def _give_up(self, flow: Flow, no_node: str | None = None) -> GiveUp:
        last = flow.last_failure
        if last is None:
            return GiveUp(
                503,
                "no_node_available",
                f"no node can take the request: {no_node}",
                retry_after_s=1.0,
            )
        return GiveUp(
            last.status,
            f"upstream_{last.kind}",
            f"upstream failed after {flow.attempts} attempt(s): {last.message}",
        )

    def attempt_failed(self, flow: Flow, decision: RouteDecision, failure: Failure) -> bool:
        """The attempt failed before the client got a byte; True if the node was ejected."""
        flow.last_failure = failure
        if flow.trace is not None:
            flow.trace.attempt_ended(failure=failure.kind)
        self.metrics.upstream_errors.labels(decision.node_id, failure.kind).inc()
        self.router.on_complete(flow.route, decision, ok=False, actual_cached_tokens=None)
        return self.outlier.record_failure(decision.node_id, failure.kind, self.clock.now())

    def attempt_done(self, flow: Flow, decision: RouteDecision, outcome: AttemptOutcome) -> None:
        """The node answered; ``outcome`` says how it ended."""
        if flow.trace is not None:
            flow.trace.attempt_ended(status=outcome.status, failure=outcome.broken, ok=outcome.ok)
        self.router.on_complete(
            flow.route, decision, ok=outcome.ok, actual_cached_tokens=outcome.cached_tokens
        )
        if (broken := outcome.broken) is not None:
            self.metrics.upstream_errors.labels(decision.node_id, broken).inc()
            self.outlier.record_failure(decision.node_id, broken, self.clock.now())
        else:
            self.outlier.record_success(decision.node_id)

    async def progress(self, flow: Flow, generated_tokens: int) -> None:
        """Tokens generated so far: the node's in-flight ledger and the reservation grow."""
        pending = self.progress_nowait(flow, generated_tokens)
        if pending is not None:
            await pending

    def progress_nowait(
        self, flow: Flow, generated_tokens: int
    ) -> Coroutine[Any, Any, None] | None:
        """``progress`` without a task: the bookkeeping now; a coroutine to await only
        when admission must drain its queue (the first token freed a gate place)."""
        if flow.decision is not None:
            self.router.on_progress(flow.route, flow.decision, generated_tokens)
        if flow.holds_reservation and self.admission is not None:
            assert flow.admission is not None
            return self.admission.progress_nowait(flow.admission, generated_tokens)
        return None

    async def release(self, flow: Flow) -> None:
        """Return the flow's reservation (once, whatever happened)."""
        if not flow.holds_reservation or self.admission is None:
            return
        flow.holds_reservation = False
        assert flow.admission is not None
        await self.admission.release(flow.admission)

    def cancelled(self, stage: str) -> None:
        self.metrics.cancellations.labels(stage).inc()

    # -- re-admission probes (the driver performs them) ----------------------------------
    def due_probes(self) -> list[str]:
        return self.outlier.due_probes(self.clock.now())

    def probe_result(self, node_id: str, ok: bool) -> None:
        self.outlier.probe_result(node_id, ok, self.clock.now())
