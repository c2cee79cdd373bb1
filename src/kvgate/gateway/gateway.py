"""The gateway: wires config, store, routing, admission, the request pipeline, proxy and scraper.

Handlers reach the one ``Gateway`` of an app through ``app[GATEWAY]``, the key defined
here beside the class it names; this module imports no handler and no app module, so
handlers, admin, logs and the front import it without a circle.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from kvgate.admission.controller import AdmissionController
from kvgate.admission.tenants import TenantDirectory
from kvgate.clock import Clock, SystemClock
from kvgate.flags import Flags
from kvgate.gateway.config import GatewayConfig
from kvgate.gateway.jobs import JobStore
from kvgate.gateway.metrics import GatewayMetrics
from kvgate.gateway.proxy import Proxy
from kvgate.gateway.registry import NodeRegistry
from kvgate.gateway.response_map import ResponseMap
from kvgate.gateway.scraper import Scraper, discover_model
from kvgate.kv_events.hub import KvEventHub
from kvgate.pipeline import (
    RequestPipeline,
    engine_kv_capacity,
    engine_kv_tokens,
    headroom_signal,
)
from kvgate.routing.node_view import NodeView
from kvgate.routing.router import Router
from kvgate.store import open_store
from kvgate.store.base import KVStore
from kvgate.store.health import StoreHealthCollector
from kvgate.tracing import Tracing, settings
from kvgate.types import NodeSpec

log = logging.getLogger("kvgate.gateway")

PROBE_POLL_S = 0.25  # how often the probe loop looks for ejections that ended


class Gateway:
    """Everything one gateway process holds; handlers reach it through ``app[GATEWAY]``."""

    def __init__(
        self,
        config: GatewayConfig,
        *,
        clock: Clock | None = None,
        store: KVStore | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.config = config
        self.clock: Clock = clock or SystemClock()
        self.registry = registry or CollectorRegistry()
        self.metrics = GatewayMetrics(self.registry)
        self.flags = Flags(config.flags)
        self._owns_store = store is None
        self.store: KVStore = store if store is not None else open_store(config.store)
        self.registry.register(StoreHealthCollector(self.store.healths))
        self.nodes = NodeView(self.clock, config.routing)
        self.router = Router(
            config.routing, self.nodes, flags=self.flags, clock=self.clock, registry=self.registry
        )
        # Always present (no sockets until a node with an event endpoint is added).
        self.kv_events = KvEventHub(config.kv_events, self.nodes, registry=self.registry)
        self.tenants = TenantDirectory(config.admission)
        self.admission = AdmissionController(
            config.admission,
            self.store,
            flags=self.flags,
            clock=self.clock,
            registry=self.registry,
            gateway_id=config.gateway_id,
            engine_usage=lambda: engine_kv_tokens(self.nodes),
            capacity=lambda: engine_kv_capacity(self.nodes),
            headroom=headroom_signal(self.nodes, config.admission.headroom),
        )
        self.pipeline = RequestPipeline(
            router=self.router,
            admission=self.admission,
            flags=self.flags,
            clock=self.clock,
            max_retries=config.routing.max_retries,
            config=config.pipeline,
            economy_pool=config.admission.degrade.economy_pool,
            registry=self.registry,
        )
        # OpenTelemetry: checked here (a bad OTEL_* value is a config error), run by start
        self._trace_settings = settings(config.tracing)
        self.tracing: Tracing | None = None
        # response id → the node holding it, shared by replicas (previous_response_id)
        self.response_map = ResponseMap(self.store, self.registry)
        self.jobs = JobStore(self.clock, ttl_s=config.admission.async_job_ttl_s)
        self.sources: dict[str, str] = {}  # node id → "config" | "admin" | "registry"
        self.specs: dict[str, NodeSpec] = {}
        self.started_at = time.monotonic()
        self.session: aiohttp.ClientSession | None = None
        self.proxy: Proxy | None = None
        self.scraper: Scraper | None = None
        self.node_registry: NodeRegistry | None = None
        self._background: set[asyncio.Task[Any]] = set()
        # called with each config version this replica starts running (hot reload);
        # the decision owner of ``--workers N`` passes it on to its workers
        self.config_listeners: list[Callable[[GatewayConfig], None]] = []
        # awaited before /metrics renders (the owner of --workers N fetches fresh worker
        # counters here, so a scrape never reads a worker's figures from a second ago)
        self.metrics_refreshers: list[Callable[[], Awaitable[None]]] = []

    # -- nodes -------------------------------------------------------------------------
    def add_node(self, spec: NodeSpec, source: str) -> None:
        self.nodes.add_node(spec)
        self.specs[spec.node_id] = spec
        self.sources[spec.node_id] = source
        if self.scraper is not None and self._is_pulled(spec.node_id):
            self.spawn(self.scraper.scrape_node(spec))

    def remove_node(self, node_id: str) -> None:
        self.nodes.remove_node(node_id)
        self.pipeline.outlier.forget(node_id)
        self.specs.pop(node_id, None)
        self.sources.pop(node_id, None)

    def node_url(self, node_id: str) -> str | None:
        spec = self.specs.get(node_id)
        return spec.url if spec else None

    def _is_pulled(self, node_id: str) -> bool:
        source = self.sources.get(node_id)
        if source == "registry":
            return False
        return source == "admin" or self.config.scrape.mode == "pull"

    def pulled_specs(self) -> list[NodeSpec]:
        return [s for nid, s in self.specs.items() if self._is_pulled(nid)]

    def models(self) -> list[str]:
        return sorted({s.model for s in self.specs.values()})

    async def resolve_model(self, url: str, configured: str | None) -> str:
        """The configured model, else the backend's first /v1/models entry, else "default"."""
        if configured:
            return configured
        assert self.session is not None
        deadline = time.monotonic() + self.config.server.discover_timeout_s
        while True:
            try:
                return await discover_model(self.session, url, timeout_s=1.0)
            except (aiohttp.ClientError, TimeoutError, KeyError, IndexError, ValueError) as exc:
                if time.monotonic() >= deadline:
                    log.warning("cannot discover the model of %s (%s); using 'default'", url, exc)
                    return "default"
            await asyncio.sleep(0.2)

    # -- lifecycle ---------------------------------------------------------------------
    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def start(self) -> None:
        if self._trace_settings is not None:
            self.tracing = self.pipeline.tracing = Tracing(self._trace_settings)
        server = self.config.server
        connector = aiohttp.TCPConnector(limit=server.upstream_pool_size, ttl_dns_cache=300)
        self.session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(sock_connect=server.connect_timeout_s),
            auto_decompress=False,
        )
        models = await asyncio.gather(
            *(self.resolve_model(n.url, n.model) for n in self.config.nodes)
        )
        for node, model in zip(self.config.nodes, models, strict=True):
            self.add_node(node.spec(model), "config")
            if node.kv_events is not None:
                self.kv_events.add(node.id, node.kv_events, node.engine_type)
        self.proxy = Proxy.configured(
            self.config,
            session=self.session,
            pipeline=self.pipeline,
            node_url=self.node_url,
            metrics=self.metrics,
        )
        self.scraper = Scraper(
            session=self.session,
            nodes=self.nodes,
            specs=self.pulled_specs,
            clock=self.clock,
            metrics=self.metrics,
            interval_s=self.config.routing.scrape_interval_s,
            timeout_s=self.config.scrape.timeout_s,
        )
        await self.scraper.scrape_all()
        self.scraper.start()
        self.node_registry = NodeRegistry(
            store=self.store,
            nodes=self.nodes,
            flags=self.flags,
            clock=self.clock,
            metrics=self.metrics,
            sources=self.sources,
            add_node=lambda spec: self.add_node(spec, "registry"),
            remove_node=self.remove_node,
        )
        self.node_registry.start()
        self.spawn(self._probe_loop())
        await self.admission.start()
        self.started_at = time.monotonic()
        log.info(
            "gateway %s up: %d node(s), policy=%s, store=%s",
            self.config.gateway_id,
            len(self.specs),
            self.config.routing.policy,
            self.config.store,
        )

    async def _probe_loop(self) -> None:
        """Probe ejected nodes when their ejection ends (the outlier detector decides)."""
        while True:
            for node_id in self.pipeline.due_probes():
                self.spawn(self._probe(node_id))
            next_at = self.pipeline.outlier.next_probe_at()
            wait = PROBE_POLL_S if next_at is None else next_at - self.clock.now()
            await asyncio.sleep(min(PROBE_POLL_S, max(0.01, wait)))

    async def _probe(self, node_id: str) -> None:
        url = self.node_url(node_id)
        if url is None:  # removed meanwhile
            self.pipeline.outlier.forget(node_id)
            return
        assert self.session is not None
        timeout = aiohttp.ClientTimeout(total=self.config.pipeline.outlier.probe_timeout_s)
        ok = False
        try:
            async with self.session.get(url + "/health", timeout=timeout) as resp:
                ok = resp.status == 200
        except Exception:  # any failure is a failed probe (never a node stuck "probing")
            ok = False
        finally:
            self.pipeline.probe_result(node_id, ok)
        spec = self.specs.get(node_id)
        if ok and spec is not None and self.scraper is not None and self._is_pulled(node_id):
            # a fresh report at once: failed scrapes may have marked it unreachable, and
            # it should not wait for the next scrape round to take traffic again
            await self.scraper.scrape_node(spec)

    async def stop(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self.scraper:
            await self.scraper.stop()
        if self.node_registry:
            await self.node_registry.stop()
        await self.admission.stop()
        await self.kv_events.stop()
        if self.proxy:
            self.proxy.close()
        if self.session:
            await self.session.close()
        if self._owns_store:
            await self.store.close()
        if self.tracing is not None:  # what is buffered is exported (a thread, off the loop)
            await asyncio.to_thread(self.tracing.shutdown)
            self.tracing = self.pipeline.tracing = None


GATEWAY: web.AppKey[Gateway] = web.AppKey("kvgate_gateway")

__all__ = ["GATEWAY", "Gateway"]
