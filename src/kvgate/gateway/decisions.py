"""The decision owner of ``kvgate serve --workers N``: one request pipeline for all workers.

The owner is a full gateway (router, admission ledger, outlier detector, retry budget,
scraper, registry, admin API: one ``Gateway`` and its one ``RequestPipeline``); N worker
processes accept client connections and move the bytes. A worker's ``RemotePipeline``
(``kvgate.gateway.remote``) turns the pipeline's calls into messages, which this module
applies to the owner's pipeline:

* ``admit`` (call): ``start`` + ``admit``, and for a request that goes upstream at once
  also ``next_attempt`` (the first attempt's routing rides on the admit answer);
* ``next`` (call, ordered): ``next_attempt`` for a retry, or the give-up;
* ``failed`` / ``done`` (one-way): ``attempt_failed`` / ``attempt_done``;
* ``progress``, ``release``, ``cancelled`` (one-way), ``cancel`` (the client left:
  a pending ``admit`` is cancelled, a finished one released);
* ``job`` (call, ordered): an async job runs here, with the flow the owner admitted;
* ``models`` (call): the served models, which workers cache to resolve ``model``.

The owner sends each worker its running config when the worker connects and again on
every config version it applies, so tenant keys, classes and limits change without a
restart.

A worker's one-way messages and ordered calls are applied in the order it sent them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from kvgate.gateway.admission_http import admission_header
from kvgate.gateway.config import GatewayConfig
from kvgate.gateway.errors import ApiError
from kvgate.gateway.gateway import Gateway
from kvgate.gateway.handlers import start_async_job
from kvgate.gateway.ipc import Admitted, Attempt, FrameProtocol, error_tuple, give_up_fields
from kvgate.gateway.proxy import Call
from kvgate.pipeline import AttemptOutcome, Failure, Flow, GiveUp
from kvgate.types import AdmissionKind, AdmissionRequest, RouteRequest

log = logging.getLogger("kvgate.gateway.decisions")

_ORDERED_CALLS = frozenset({"next", "job", "models"})
WORKER_METRICS_WAIT_S = 0.5  # /metrics waits at most this long for the workers' figures


class DecisionOwner:
    """Applies workers' pipeline messages to the owner's one ``RequestPipeline``."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.pipeline = gateway.pipeline
        self.flows: dict[tuple[int, int], Flow] = {}
        self.admitting: dict[tuple[int, int], asyncio.Task[Any]] = {}
        self.worker_metrics = MergedMetrics()
        self.connections: dict[int, _OwnerConnection] = {}
        # a config version applied here (admin endpoint, `kvgate config`, another replica's
        # apply seen in the store) reaches every worker: tenants, keys, classes, limits
        gateway.config_listeners.append(self.config_changed)
        gateway.metrics_refreshers.append(self.refresh_worker_metrics)
        self._metrics_asked = 0
        self._metrics_waiters: dict[tuple[int, int], asyncio.Future[None]] = {}

    async def serve(self, path: str) -> asyncio.AbstractServer:
        loop = asyncio.get_running_loop()
        counter = iter(range(1, 1 << 30))
        return await loop.create_unix_server(lambda: _OwnerConnection(self, next(counter)), path)

    async def refresh_worker_metrics(self, timeout_s: float = WORKER_METRICS_WAIT_S) -> None:
        """Ask every worker for its metrics now and wait (briefly) for the answers."""
        if not self.connections:
            return
        self._metrics_asked += 1
        n = self._metrics_asked
        loop = asyncio.get_running_loop()
        keys = [(worker, n) for worker in self.connections]
        for key in keys:
            self._metrics_waiters[key] = loop.create_future()
            self.connections[key[0]].send(("metrics?", n), now=True)
        try:  # a stuck worker: its last push is served
            await asyncio.wait([self._metrics_waiters[k] for k in keys], timeout=timeout_s)
        finally:
            for key in keys:
                self._metrics_waiters.pop(key, None)

    def metrics_arrived(self, worker: int, text: str, asked: int) -> None:
        self.worker_metrics.update(worker, text)
        waiter = self._metrics_waiters.pop((worker, asked), None) if asked else None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def config_changed(self, config: GatewayConfig) -> None:
        for conn in list(self.connections.values()):
            conn.send(("config", config), now=True)

    # -- calls -------------------------------------------------------------------------
    async def admit(
        self,
        worker: int,
        key: int,
        route: RouteRequest,
        request: AdmissionRequest,
        priority_min: int,
        wants_async: bool,
        traceparent: str | None = None,
    ) -> Admitted:
        flow = self.pipeline.start(
            route,
            request,
            priority_min=priority_min,
            wants_async=wants_async,
            traceparent=traceparent,
        )
        result = await self.pipeline.admit(flow)
        answer = Admitted(dataclasses.replace(result, ticket=None), flow.run_async)
        if result.kind is AdmissionKind.REJECT:
            return answer
        self.flows[(worker, key)] = flow
        if not flow.run_async and result.kind is not AdmissionKind.QUEUE:
            answer.first = self._attempt(flow)  # the worker dispatches at once
        return answer

    def next(self, worker: int, key: int) -> Attempt:
        flow = self.flows.get((worker, key))
        if flow is None:
            raise ApiError(503, "the request is no longer known to the decision owner")
        return self._attempt(flow)

    def _attempt(self, flow: Flow) -> Attempt:
        try:
            decision = self.pipeline.next_attempt(flow)
        except GiveUp as stop:
            return Attempt(None, give_up=give_up_fields(stop))
        return Attempt(
            decision, self.gateway.node_url(decision.node_id), traceparent=flow.upstream_traceparent
        )

    def job(self, worker: int, key: int, path: str, endpoint: str, body: dict[str, Any]) -> Any:
        """Run an admitted request as an async job here (the job releases its flow)."""
        flow = self.flows.pop((worker, key))
        assert flow.admission is not None and flow.admission_request is not None
        call = Call(
            request_id=flow.request_id,
            path=path,
            endpoint=endpoint,
            body=body,
            flow=flow,
            started=time.perf_counter(),
            headers={"X-KVGate-Admission": admission_header(flow.admission)},
        )
        response = start_async_job(
            self.gateway, call, flow.admission, flow.admission_request.tenant
        )
        return response.status, dict(response.headers), response.body

    # -- one-way -----------------------------------------------------------------------
    def failed(self, worker: int, key: int, failure: Failure) -> None:
        flow = self.flows.get((worker, key))
        if flow is not None and flow.decision is not None:
            self.pipeline.attempt_failed(flow, flow.decision, failure)

    def done(self, worker: int, key: int, outcome: AttemptOutcome) -> None:
        flow = self.flows.get((worker, key))
        if flow is not None and flow.decision is not None:
            self.pipeline.attempt_done(flow, flow.decision, outcome)

    async def progress(self, worker: int, key: int, generated: int) -> None:
        flow = self.flows.get((worker, key))
        if flow is not None:
            await self.pipeline.progress(flow, generated)

    async def release(self, worker: int, key: int) -> None:
        flow = self.flows.pop((worker, key), None)
        if flow is not None:
            await self.pipeline.release(flow)

    async def cancel(self, worker: int, key: int) -> None:
        """The worker's client left during ``admit``: drop the request either way."""
        task = self.admitting.get((worker, key))
        if task is not None and not task.done():
            task.cancel()  # out of the admission queue (the pipeline counts it)
            return
        await self.release(worker, key)  # admitted, but the answer found nobody

    async def worker_gone(self, worker: int) -> None:
        """A worker died: cancel and release whatever it still held."""
        for k, task in list(self.admitting.items()):
            if k[0] == worker:
                task.cancel()
        for k in [k for k in self.flows if k[0] == worker]:
            await self.release(*k)


class _OwnerConnection(FrameProtocol):
    def __init__(self, owner: DecisionOwner, worker: int) -> None:
        super().__init__(self._frame, self._lost)
        self.owner = owner
        self.worker = worker
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._ordered())

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.owner.connections[self.worker] = self
        # before any answer: the worker runs the owner's config from its first request
        self.send(("config", self.owner.gateway.config), now=True)

    def _lost(self) -> None:
        self.owner.connections.pop(self.worker, None)
        self._queue.put_nowait(("gone",))

    def _frame(self, frame: Any) -> None:
        op = frame[0]
        if op == "admit":  # may wait in the admission queue: not in line with the rest
            k = (self.worker, frame[2])
            task = asyncio.get_running_loop().create_task(self._admit(frame))
            self.owner.admitting[k] = task
            task.add_done_callback(lambda _: self.owner.admitting.pop(k, None))
        elif op == "metrics":
            self.owner.metrics_arrived(self.worker, frame[1], frame[2] if len(frame) > 2 else 0)
        else:
            self._queue.put_nowait(frame)

    async def _admit(self, frame: Any) -> None:
        seq = frame[1]
        try:
            reply: Any = ("ok", seq, await self.owner.admit(self.worker, *frame[2:]))
        except asyncio.CancelledError:
            return  # the worker's client left; it waits for no answer
        except ApiError as exc:
            reply = ("err", seq, error_tuple(exc))
        except Exception as exc:  # the worker must get an answer, never hang
            log.exception("admit failed")
            reply = ("err", seq, error_tuple(ApiError(500, f"admit failed: {type(exc).__name__}")))
        self.send(reply)

    async def _ordered(self) -> None:
        """One-way messages and ordered calls, applied in the order the worker sent them."""
        owner, worker = self.owner, self.worker
        while True:
            frame = await self._queue.get()
            op = frame[0]
            try:
                if op in _ORDERED_CALLS:
                    self._answer(frame)
                elif op == "done":
                    owner.done(worker, *frame[1:])
                elif op == "progress":
                    await owner.progress(worker, *frame[1:])
                elif op == "release":
                    await owner.release(worker, *frame[1:])
                elif op == "failed":
                    owner.failed(worker, *frame[1:])
                elif op == "cancelled":
                    owner.pipeline.cancelled(frame[1])
                elif op == "cancel":
                    await owner.cancel(worker, *frame[1:])
                elif op == "gone":
                    await owner.worker_gone(worker)
                    return
            except Exception:
                log.exception("worker message %s failed", op)

    def _answer(self, frame: Any) -> None:
        op, seq, args = frame[0], frame[1], frame[2:]
        try:
            if op == "next":
                reply: Any = ("ok", seq, self.owner.next(self.worker, *args))
            elif op == "models":
                reply = ("ok", seq, self.owner.gateway.models())
            else:
                reply = ("ok", seq, self.owner.job(self.worker, *args))
        except ApiError as exc:
            reply = ("err", seq, error_tuple(exc))
        except Exception as exc:  # the worker must get an answer, never hang
            log.exception("decision %s failed", op)
            reply = ("err", seq, error_tuple(ApiError(500, f"{op} failed: {type(exc).__name__}")))
        self.send(reply)


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


def merge_gateway_metrics(
    registry: CollectorRegistry, metrics: Any, merged: MergedMetrics, *extra: Any
) -> None:
    """Move the owner's data-plane metrics (GatewayMetrics and ``extra`` collectors, which
    the workers also count) behind ``merged``, so one family covers all processes."""
    local = CollectorRegistry()
    collectors = [v for v in vars(metrics).values() if hasattr(v, "collect")]
    for value in [*collectors, *extra]:
        if not isinstance(value, CollectorRegistry):
            registry.unregister(value)
            local.register(value)
    merged.local = local
    registry.register(merged)
