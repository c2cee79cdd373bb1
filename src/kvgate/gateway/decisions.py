"""One decision owner, many byte-pushing workers: the IPC between them.

``kvgate serve --workers N`` runs the full gateway (router, admission ledger, scraper,
registry, admin API) in one process, the *decision owner*, and N worker processes that
accept client connections (SO_REUSEPORT) and move the bytes. Per request a worker makes
one round trip, ``begin`` (admit + place + route: the owner's answer carries the
decision, the node's URL and retry alternates), then sends one-way ``dispatch``,
``progress``, ``complete`` and ``release`` messages, which leave batched (one socket
write per event-loop turn) and are applied by the owner in order. Every tenant's quota
is therefore held in one ledger and every routing decision sees one node view.

Frames on the Unix socket: 4-byte length + pickle (both ends are this program).
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from kvgate.gateway.errors import ApiError
from kvgate.types import (
    AdmissionKind,
    AdmissionRequest,
    AdmissionResult,
    RouteDecision,
    RouteRequest,
)

log = logging.getLogger("kvgate.gateway.decisions")

_LEN = struct.Struct("!I")


class FrameProtocol(asyncio.Protocol):
    """Length-prefixed pickled frames; outgoing frames are flushed once per loop turn."""

    def __init__(self, on_frame: Callable[[Any], None], on_lost: Callable[[], None]) -> None:
        self.on_frame = on_frame
        self.on_lost = on_lost
        self.transport: asyncio.Transport | None = None
        self._buf = b""
        self._out: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.on_lost()

    def data_received(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        pos, n = 0, len(buf)
        while n - pos >= 4:
            (size,) = _LEN.unpack_from(buf, pos)
            if n - pos - 4 < size:
                break
            frame = pickle.loads(buf[pos + 4 : pos + 4 + size])
            pos += 4 + size
            self.on_frame(frame)
        self._buf = buf[pos:]

    def send(self, message: Any, *, now: bool = False) -> None:
        """Queue a frame for this loop turn's write; ``now`` writes it (and the queue) at once."""
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        if not self._out and not now:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.append(_LEN.pack(len(data)) + data)
        if now:
            self._flush()

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self.transport is not None and out:
            self.transport.write(b"".join(out))


# -- messages ---------------------------------------------------------------------------
@dataclass(slots=True)
class Begin:
    key: int
    route: RouteRequest
    model: str | None  # as the client asked
    tenant: str
    priority_min: int
    priority_class: str
    wants_async: bool


@dataclass(slots=True)
class Plan:
    """The owner's answer to ``begin``."""

    admission: str  # X-KVGate-Admission
    decision: RouteDecision | None  # None: no node (the error says why) or an async job
    urls: dict[str, str] = field(default_factory=dict)  # node id → base URL (chosen + alternates)
    alternates: list[str] = field(default_factory=list)  # retry order, most preferred first
    no_node: str | None = None
    async_job: bool = False


def error_tuple(exc: ApiError) -> tuple[Any, ...]:
    return (exc.status, exc.message, exc.type_, exc.param, exc.code, exc.headers)


def error_from(t: tuple[Any, ...]) -> ApiError:
    status, message, type_, param, code, headers = t
    return ApiError(status, message, type_=type_, param=param, code=code, headers=headers)


# -- the owner --------------------------------------------------------------------------
@dataclass(slots=True)
class _InFlight:
    route: RouteRequest
    result: AdmissionResult
    tenant: str
    decisions: dict[str, RouteDecision] = field(default_factory=dict)
    dispatched: set[str] = field(default_factory=set)  # on_dispatch already counted


class DecisionOwner:
    """Serves ``begin``/``dispatch``/``progress``/``complete``/``release`` for workers."""

    def __init__(self, gateway: Any) -> None:
        self.gateway = gateway
        self.inflight: dict[tuple[int, int], _InFlight] = {}
        self.worker_metrics = MergedMetrics()
        self.ipc_seconds = 0.0  # owner CPU spent serving workers (for the docs' IPC figure)
        self.ipc_messages = 0

    async def serve(self, path: str) -> asyncio.AbstractServer:
        loop = asyncio.get_running_loop()
        counter = iter(range(1, 1 << 30))
        return await loop.create_unix_server(lambda: _OwnerConnection(self, next(counter)), path)

    async def begin(self, worker: int, msg: Begin) -> Plan:
        from kvgate.gateway.handlers import _model_for, _rejection, place

        g = self.gateway
        route = msg.route
        route.model = _model_for(g, {"model": msg.model} if msg.model is not None else {})
        result = await g.admission.admit(
            AdmissionRequest(
                request_id=route.request_id,
                tenant=msg.tenant,
                priority_class=msg.priority_class,
                prompt_tokens=route.prompt_tokens,
                max_tokens=route.max_tokens,
                wants_async=msg.wants_async,
            )
        )
        if result.kind is AdmissionKind.REJECT:
            raise _rejection(result)
        place(g, route, result, msg.priority_min)
        entry = _InFlight(route, result, msg.tenant)
        self.inflight[(worker, msg.key)] = entry
        plan = Plan(admission=result.header(), decision=None)
        if msg.wants_async or result.degrade_to == "async":
            plan.async_job = True
            return plan
        from kvgate.types import NoNodeAvailable

        try:
            decision = g.router.route(route)
        except NoNodeAvailable as exc:
            plan.no_node = str(exc)
            return plan
        plan.decision = decision
        entry.decisions[decision.node_id] = decision
        # the worker dispatches at once: count it here and save a message per request
        g.router.on_dispatch(route, decision)
        entry.dispatched.add(decision.node_id)
        plan.urls[decision.node_id] = g.node_url(decision.node_id) or ""
        if g.proxy is not None and g.proxy.max_retries and g.flags.enabled("retries"):
            plan.alternates = self._alternates(route, decision.node_id)
            for node in plan.alternates:
                plan.urls[node] = g.node_url(node) or ""
        return plan

    def _alternates(self, route: RouteRequest, chosen: str) -> list[str]:
        from kvgate.routing.policies.filters import eligible_nodes

        g = self.gateway
        eligible, loads, _ = eligible_nodes(
            g.nodes, route, g.config.routing, g.clock.now(), exclude=(chosen,)
        )
        return sorted((e.spec.node_id for e in eligible), key=lambda n: loads.get(n, 0.0))

    def dispatch(self, worker: int, key: int, node: str, reason: str) -> None:
        entry = self.inflight.get((worker, key))
        if entry is None:
            return
        if node in entry.dispatched:  # the first attempt, counted in begin
            entry.dispatched.discard(node)
            return
        decision = entry.decisions.get(node)
        if decision is None:  # a retry on an alternate
            policy = self.gateway.router.policy.name
            decision = RouteDecision(node, reason, 0, policy)
            entry.decisions[node] = decision
        self.gateway.router.on_dispatch(entry.route, decision)

    async def progress(self, worker: int, key: int, node: str, generated: int) -> None:
        entry = self.inflight.get((worker, key))
        if entry is None:
            return
        decision = entry.decisions.get(node)
        if decision is not None:
            self.gateway.router.on_progress(entry.route, decision, generated)
        await self.gateway.admission.progress(entry.result, generated)

    def complete(
        self, worker: int, key: int, node: str, ok: bool, cached: int | None, output: int
    ) -> None:
        entry = self.inflight.get((worker, key))
        decision = entry.decisions.get(node) if entry else None
        if entry is None or decision is None:
            return
        self.gateway.router.on_complete(
            entry.route, decision, ok=ok, actual_cached_tokens=cached, output_tokens=output
        )

    async def release(self, worker: int, key: int) -> None:
        entry = self.inflight.pop((worker, key), None)
        if entry is not None:
            await self.gateway.admission.release(entry.result)

    async def job(
        self, worker: int, key: int, path: str, endpoint: str, body: dict[str, Any]
    ) -> Any:
        """Start an async job for a request the owner admitted (its admission moves along)."""
        from kvgate.gateway.handlers import start_async_job
        from kvgate.gateway.proxy import Call

        entry = self.inflight.pop((worker, key))
        call = Call(
            request_id=entry.route.request_id,
            path=path,
            endpoint=endpoint,
            body=body,
            route=entry.route,
            started=time.perf_counter(),
            headers={"X-KVGate-Admission": entry.result.header()},
        )
        response = start_async_job(self.gateway, call, entry.result, entry.tenant)
        return response.status, dict(response.headers), response.body

    async def worker_gone(self, worker: int) -> None:
        """A worker died: release whatever it still held."""
        for key in [k for k in self.inflight if k[0] == worker]:
            await self.release(*key)


class _OwnerConnection(FrameProtocol):
    def __init__(self, owner: DecisionOwner, worker: int) -> None:
        super().__init__(self._frame, self._lost)
        self.owner = owner
        self.worker = worker
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._ordered())

    def _lost(self) -> None:
        self._queue.put_nowait(("gone",))

    def _frame(self, frame: Any) -> None:
        op = frame[0]
        if op in ("begin", "job"):
            asyncio.get_running_loop().create_task(self._answer(frame))
        elif op == "metrics":
            self.owner.worker_metrics.update(self.worker, frame[1])
        else:
            self._queue.put_nowait(frame)

    async def _answer(self, frame: Any) -> None:
        op, seq = frame[0], frame[1]
        try:
            if op == "begin":
                reply: Any = ("ok", seq, await self.owner.begin(self.worker, frame[2]))
            else:
                reply = ("ok", seq, await self.owner.job(self.worker, *frame[2:]))
        except ApiError as exc:
            reply = ("err", seq, error_tuple(exc))
        except Exception as exc:  # the worker must get an answer, never hang
            log.exception("decision %s failed", op)
            reply = (
                "err",
                seq,
                error_tuple(ApiError(500, f"decision failed: {type(exc).__name__}")),
            )
        self.send(reply)

    async def _ordered(self) -> None:
        """One-way messages, applied in the order the worker sent them."""
        owner, worker = self.owner, self.worker
        while True:
            frame = await self._queue.get()
            op = frame[0]
            t0 = time.process_time()
            try:
                if op == "dispatch":
                    owner.dispatch(worker, *frame[1:])
                elif op == "progress":
                    await owner.progress(worker, *frame[1:])
                elif op == "complete":
                    owner.complete(worker, *frame[1:])
                elif op == "release":
                    await owner.release(worker, *frame[1:])
                elif op == "gone":
                    await owner.worker_gone(worker)
                    return
            except Exception:
                log.exception("worker message %s failed", op)
            owner.ipc_seconds += time.process_time() - t0
            owner.ipc_messages += 1


# -- the worker's end -------------------------------------------------------------------
class DecisionClient:
    """A worker's connection to the owner."""

    def __init__(self, on_lost: Callable[[], None] | None = None) -> None:
        self.on_lost = on_lost
        self._proto: FrameProtocol | None = None
        self._waiters: dict[int, asyncio.Future[Any]] = {}
        self._seq = 0

    async def connect(self, path: str) -> None:
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_unix_connection(
            lambda: FrameProtocol(self._frame, self._lost), path
        )
        self._proto = proto

    def _lost(self) -> None:
        self._proto = None
        if self.on_lost is not None:
            self.on_lost()
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_exception(ApiError(503, "decision owner unavailable"))
        self._waiters.clear()

    def _frame(self, frame: Any) -> None:
        waiter = self._waiters.pop(frame[1], None)
        if waiter is None or waiter.done():
            return
        if frame[0] == "ok":
            waiter.set_result(frame[2])
        else:
            waiter.set_exception(error_from(frame[2]))

    async def call(self, op: str, *args: Any) -> Any:
        if self._proto is None:
            raise ApiError(503, "decision owner unavailable", code="owner_unavailable")
        self._seq += 1
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters[self._seq] = waiter
        self._proto.send((op, self._seq, *args))
        return await waiter

    def tell(self, *message: Any, now: bool = False) -> None:
        if self._proto is not None:
            self._proto.send(message, now=now)


# -- metrics of all workers, served by the owner ----------------------------------------
class MergedMetrics(Collector):
    """The owner's own data-plane families plus every worker's, summed by label set."""

    def __init__(self) -> None:
        self.local: CollectorRegistry | None = None
        self.remote: dict[int, str] = {}

    def update(self, worker: int, text: str) -> None:
        self.remote[worker] = text

    def collect(self) -> Any:
        merged: dict[str, Metric] = {}
        sums: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}

        def add(family: Any) -> None:
            if family.name not in merged:
                merged[family.name] = Metric(family.name, family.documentation, family.type)
                sums[family.name] = {}
            bucket = sums[family.name]
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                key = (sample.name, tuple(sorted(sample.labels.items())))
                bucket[key] = bucket.get(key, 0.0) + sample.value

        if self.local is not None:
            for family in self.local.collect():
                add(family)
        for text in list(self.remote.values()):
            for family in text_string_to_metric_families(text):
                add(family)
        for name, metric in merged.items():
            for (sample_name, labels), value in sums[name].items():
                metric.add_sample(sample_name, dict(labels), value)
            yield metric

    def describe(self) -> list[Metric]:
        return []


def merge_gateway_metrics(registry: CollectorRegistry, metrics: Any, merged: MergedMetrics) -> None:
    """Move the owner's GatewayMetrics behind ``merged`` so one family covers all processes."""
    local = CollectorRegistry()
    for value in vars(metrics).values():
        if hasattr(value, "collect") and not isinstance(value, CollectorRegistry):
            registry.unregister(value)
            local.register(value)
    merged.local = local
    registry.register(merged)
