"""AdmissionController: the live wrapper around AdmissionCore (asyncio waiting + loops).

A queued request waits on a future; one pump task admits queued work when capacity
frees (local releases wake it at once; other gateways' releases are seen by polling the
store while the queue is non-empty) and answers 408 exactly at each deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from kvgate.admission.config import AdmissionConfig
from kvgate.admission.core import AdmissionCore
from kvgate.admission.driver import CoreDriver
from kvgate.admission.dynamic_quota import DynamicQuota
from kvgate.admission.metrics import AdmissionMetrics
from kvgate.admission.queue import QueuedRequest
from kvgate.clock import Clock, SystemClock
from kvgate.flags import Flags
from kvgate.store import Store, with_counters
from kvgate.store.base import KVStore, StoreUnavailable
from kvgate.store.keys import TENANTS_PREFIX, TOTAL_QUOTA
from kvgate.types import AdmissionKind, AdmissionRequest, AdmissionResult

log = logging.getLogger("kvgate.admission")

QUEUE_POLL_S = 0.05  # how often a non-empty queue re-checks the shared store
WATCH_RETRY_S = 1.0
STOP_WAIT_S = 5.0  # the most stop() waits for its cancelled tasks


def default_gateway_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class AdmissionController(CoreDriver):
    def __init__(
        self,
        config: AdmissionConfig,
        store: KVStore,
        *,
        flags: Flags,
        clock: Clock | None = None,
        registry: CollectorRegistry | None = None,
        gateway_id: str | None = None,
        engine_usage: Callable[[], int | None] | None = None,
        capacity: Callable[[], int | None] | None = None,
        local_store: Store | None = None,
        forecast: Callable[[float], float | None] | None = None,
        headroom: Callable[[], bool] | None = None,
    ) -> None:
        self.config = config
        self.store: Store = with_counters(store)  # a plain KVStore: counters stay in process
        self.flags = flags
        self.clock: Clock = clock or SystemClock()
        self.metrics = AdmissionMetrics(registry)
        self.gateway_id = gateway_id or default_gateway_id()
        # reservations are held per controller instance: two replicas configured with the
        # same id (or a restart) never share a lease, so a crash always returns its tokens
        self.lease_holder = f"{self.gateway_id}#{uuid.uuid4().hex[:8]}"
        self.core = AdmissionCore(
            config,
            self.store,
            flags=flags,
            gateway_id=self.lease_holder,
            metrics=self.metrics,
            engine_usage=engine_usage,
            local_store=local_store,
            headroom=headroom,
        )
        self.dynamic = DynamicQuota(self.core, self.store, capacity, forecast=forecast)
        self._tasks: list[asyncio.Task[Any]] = []
        self._pump_task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._started = False

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        try:
            await self.store.set_guarantees(self.core.book.guarantees())
            for key, value in (await self.store.get_prefix(TENANTS_PREFIX)).items():
                self.core.book.apply_store_value(key, value)
            total = await self.store.get(TOTAL_QUOTA)
            if total is not None:
                self.core.book.apply_store_value(TOTAL_QUOTA, total)
            await self.store.set_guarantees(self.core.book.guarantees())
        except (StoreUnavailable, ConnectionError, OSError) as exc:
            self.core.link.mark(False, exc)
        await self.core.refresh(self.config.lease_ttl_s)
        self._tasks = [
            asyncio.create_task(self._heartbeat_loop(), name="admission-heartbeat"),
            asyncio.create_task(self._dynamic_loop(), name="admission-dynamic-quota"),
            asyncio.create_task(self._watch_loop(TENANTS_PREFIX), name="admission-watch-tenants"),
            asyncio.create_task(self._watch_loop(TOTAL_QUOTA), name="admission-watch-total"),
        ]
        self._ensure_pump()

    async def stop(self) -> None:
        tasks = self._tasks + ([self._pump_task] if self._pump_task else [])
        self._tasks, self._pump_task, self._started = [], None, False
        for task in tasks:
            task.cancel()
        if tasks:
            # bounded: a store client call that swallows the cancellation (seen with the
            # store's server already gone) must not hang the shutdown
            stopped, stuck = await asyncio.wait(tasks, timeout=STOP_WAIT_S)
            for task in stopped:
                if not task.cancelled() and (error := task.exception()) is not None:
                    log.debug("admission task %s ended with %r", task, error)
            for task in stuck:
                log.warning("admission task %s did not stop within %.0f s", task, STOP_WAIT_S)
        for item in self.core.expire(float("inf")):
            self._resolve(item)

    # -- the request path --------------------------------------------------------------
    async def admit(self, req: AdmissionRequest) -> AdmissionResult:
        """The decision; a queued request waits here until admitted or past its deadline.

        Async degraded work is answered at once (DEGRADE, degrade_to="async") while it
        waits in the queue: ``until_admitted`` waits for its turn.
        """
        result = await self.core.try_admit(req, self.clock.now())
        if not isinstance(result.ticket, QueuedRequest):
            return result
        item: QueuedRequest = result.ticket
        future: asyncio.Future[AdmissionResult] = asyncio.get_running_loop().create_future()
        item.handle = future
        self._ensure_pump()
        self._wake.set()
        if result.kind is not AdmissionKind.QUEUE:
            return result
        return await self.until_admitted(result)

    async def until_admitted(self, result: AdmissionResult) -> AdmissionResult:
        """The final decision for a result still waiting in the queue (else ``result``)."""
        item = result.ticket
        if not isinstance(item, QueuedRequest) or not isinstance(item.handle, asyncio.Future):
            return result
        future: asyncio.Future[AdmissionResult] = item.handle
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            self.core.cancel(item, self.clock.now())
            if future.done() and not future.cancelled():
                await self.release(future.result())
            raise

    def snapshot(self) -> dict[str, Any]:
        snap = self.core.snapshot()
        snap["gateway_id"] = self.gateway_id
        snap["lease_holder"] = self.lease_holder
        return snap

    # -- background --------------------------------------------------------------------
    def _resolve(self, item: QueuedRequest) -> None:
        future = item.handle
        if isinstance(future, asyncio.Future) and not future.done():
            future.set_result(item.outcome)
        elif item.outcome is not None and item.outcome.kind is AdmissionKind.ADMIT:
            asyncio.get_running_loop().create_task(self.release(item.outcome))

    def _ensure_pump(self) -> None:
        if self._pump_task is None or self._pump_task.done():
            self._pump_task = asyncio.create_task(self._pump(), name="admission-pump")

    async def _pump(self) -> None:
        while True:
            now = self.clock.now()
            for item in self.core.expire(now):
                self._resolve(item)
            try:
                for item in await self.core.drain(now):
                    self._resolve(item)
            except Exception:  # a store hiccup must not stop the queue
                log.exception("admission queue drain failed")
            timeout: float | None = None
            if len(self.core.queue):
                timeout = QUEUE_POLL_S
                deadline = self.core.queue.next_deadline()
                if deadline is not None:
                    timeout = min(timeout, max(0.0, deadline - self.clock.now()))
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    async def _heartbeat_loop(self) -> None:
        interval = self.config.heartbeat_interval_s
        while True:
            await asyncio.sleep(interval)
            await self.core.refresh(self.config.lease_ttl_s)
            self._wake.set()

    async def _dynamic_loop(self) -> None:
        while True:
            if self.flags.enabled("dynamic_quota"):
                try:
                    await self.dynamic.tick(self.clock.now())
                except Exception:
                    log.exception("dynamic quota step failed")
                self._wake.set()
            await asyncio.sleep(self.config.dynamic_quota.check_s)

    async def _watch_loop(self, prefix: str) -> None:
        while True:
            try:
                async for event in self.store.watch_prefix(prefix):
                    if self.core.book.apply_store_value(event.key, event.value):
                        with contextlib.suppress(StoreUnavailable, ConnectionError, OSError):
                            await self.store.set_guarantees(self.core.book.guarantees())
                        self._wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("store watch on %s interrupted: %s", prefix, exc)
            await asyncio.sleep(WATCH_RETRY_S)
