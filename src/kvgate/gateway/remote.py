"""The request pipeline as a proxy worker sees it: every decision is the owner's.

``RemotePipeline`` answers the calls the handlers and the proxy make of a
``RequestPipeline`` (start, admit, next_attempt, attempt_failed, attempt_done, progress,
release, cancelled) by messages to the decision owner, whose one ``RequestPipeline``
holds admission, routing, outlier ejection and the retry budget for all workers.

Per request: one round trip (``admit``: admission + the first attempt's routing), then
one-way ``done`` (or ``failed``), ``progress`` batches and ``release``, coalesced per
event-loop turn. A retry costs one more round trip (``next``, after its ``failed``).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable
from dataclasses import dataclass

from kvgate.gateway.ipc import Admitted, Attempt, DecisionClient
from kvgate.pipeline import AttemptOutcome, Failure, Flow
from kvgate.types import (
    AdmissionKind,
    AdmissionRequest,
    AdmissionResult,
    RouteDecision,
    RouteRequest,
)


@dataclass(slots=True)
class RemoteFlow(Flow):
    key: int = 0  # the request's id on this worker's connection
    first: Attempt | None = None  # the first attempt, routed by the owner with admit
    traceparent: str | None = None  # the request span's: the owner's stage spans' parent


class RemotePipeline:
    def __init__(self, client: DecisionClient, urls: dict[str, str]) -> None:
        self.client = client
        self.urls = urls  # node id → base URL, as the owner last said
        self._keys = itertools.count(1)

    def start(
        self,
        route: RouteRequest,
        admission_request: AdmissionRequest | None = None,
        *,
        priority_min: int = 0,
        wants_async: bool = False,
        traceparent: str | None = None,
    ) -> Flow:
        return RemoteFlow(
            route,
            admission_request,
            priority_min=priority_min,
            wants_async=wants_async,
            key=next(self._keys),
            traceparent=traceparent,
        )

    async def admit(self, flow: Flow) -> AdmissionResult:
        assert isinstance(flow, RemoteFlow)
        try:
            answer: Admitted = await self.client.call(
                "admit",
                flow.key,
                flow.route,
                flow.admission_request,
                flow.priority_min,
                flow.wants_async,
                flow.traceparent,
            )
        except asyncio.CancelledError:  # the client left (maybe while queued at the owner)
            self.client.tell("cancel", flow.key)
            raise
        result = answer.result
        flow.admission = result
        flow.run_async = answer.run_async
        flow.holds_reservation = result.kind in (AdmissionKind.ADMIT, AdmissionKind.DEGRADE)
        flow.first = answer.first
        return result

    def next_attempt(self, flow: Flow) -> RouteDecision | Awaitable[RouteDecision]:
        assert isinstance(flow, RemoteFlow)
        first, flow.first = flow.first, None
        if first is not None and not flow.attempts:
            return self._attempted(flow, first)
        return self._next(flow)

    async def _next(self, flow: RemoteFlow) -> RouteDecision:
        attempt: Attempt = await self.client.call("next", flow.key)
        return self._attempted(flow, attempt)

    def _attempted(self, flow: RemoteFlow, attempt: Attempt) -> RouteDecision:
        attempt.raise_give_up()
        decision = attempt.decision
        assert decision is not None
        if attempt.url is not None:
            self.urls[decision.node_id] = attempt.url
        if attempt.traceparent is not None:  # the owner's span of this attempt
            flow.upstream_traceparent = attempt.traceparent
        flow.tried.append(decision.node_id)
        flow.attempts += 1
        flow.decision = decision
        return decision

    def attempt_failed(self, flow: Flow, decision: RouteDecision, failure: Failure) -> bool:
        assert isinstance(flow, RemoteFlow)
        flow.last_failure = failure
        self.client.tell("failed", flow.key, failure)
        return False  # the owner's outlier detector decides; the worker need not know

    def attempt_done(self, flow: Flow, decision: RouteDecision, outcome: AttemptOutcome) -> None:
        assert isinstance(flow, RemoteFlow)
        self.client.tell("done", flow.key, outcome)

    async def progress(self, flow: Flow, generated_tokens: int) -> None:
        assert isinstance(flow, RemoteFlow)
        self.client.tell("progress", flow.key, generated_tokens)

    def progress_nowait(self, flow: Flow, generated_tokens: int) -> None:
        assert isinstance(flow, RemoteFlow)
        self.client.tell("progress", flow.key, generated_tokens)

    async def release(self, flow: Flow) -> None:
        assert isinstance(flow, RemoteFlow)
        flow.holds_reservation = False
        # written at once, with the queued ``done``, microseconds after the answer's last
        # bytes: the owner applies both before the client can ask it anything else
        self.client.tell("release", flow.key, now=True)

    def cancelled(self, stage: str) -> None:
        self.client.tell("cancelled", stage)
