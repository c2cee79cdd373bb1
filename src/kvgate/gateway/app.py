"""The gateway application: wires config, store, routing, admission, proxy and scraper."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from kvgate.admission.controller import AdmissionController
from kvgate.admission.jobs import JobStore
from kvgate.admission.tenants import TenantDirectory
from kvgate.clock import Clock, SystemClock
from kvgate.flags import Flags
from kvgate.gateway.config import GatewayConfig
from kvgate.gateway.errors import error_middleware
from kvgate.gateway.logs import access_middleware
from kvgate.gateway.metrics import GatewayMetrics
from kvgate.gateway.proxy import Proxy
from kvgate.gateway.registry import NodeRegistry
from kvgate.gateway.scraper import Scraper, discover_model
from kvgate.routing.node_view import NodeView
from kvgate.routing.router import Router
from kvgate.store import open_store
from kvgate.store.base import KVStore
from kvgate.types import NodeSpec

log = logging.getLogger("kvgate.gateway")

GATEWAY: web.AppKey[Gateway] = web.AppKey("kvgate_gateway")


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
        self.nodes = NodeView(self.clock, config.routing)
        self.router = Router(
            config.routing, self.nodes, flags=self.flags, clock=self.clock, registry=self.registry
        )
        self.tenants = TenantDirectory(config.admission)
        self.admission = AdmissionController(
            config.admission,
            self.store,
            flags=self.flags,
            clock=self.clock,
            registry=self.registry,
            gateway_id=config.gateway_id,
            engine_usage=self.engine_kv_tokens,
            capacity=self.engine_kv_capacity,
        )
        self.jobs = JobStore(self.clock, ttl_s=config.admission.async_job_ttl_s)
        self.sources: dict[str, str] = {}  # node id → "config" | "admin" | "registry"
        self.specs: dict[str, NodeSpec] = {}
        self.started_at = time.monotonic()
        self.session: aiohttp.ClientSession | None = None
        self.proxy: Proxy | None = None
        self.scraper: Scraper | None = None
        self.node_registry: NodeRegistry | None = None
        self._background: set[asyncio.Task[Any]] = set()

    # -- nodes -------------------------------------------------------------------------
    def add_node(self, spec: NodeSpec, source: str) -> None:
        self.nodes.add_node(spec)
        self.specs[spec.node_id] = spec
        self.sources[spec.node_id] = source
        if self.scraper is not None and self._is_pulled(spec.node_id):
            self.spawn(self.scraper.scrape_node(spec))

    def remove_node(self, node_id: str) -> None:
        self.nodes.remove_node(node_id)
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

    def _kv(self) -> list[tuple[float, int]]:
        """(KV usage fraction, KV capacity tokens) of each node with a fresh report."""
        out = []
        for entry in self.nodes.list():
            report = entry.report
            capacity = (report.kv_capacity_tokens if report else None) or (
                entry.spec.kv_capacity_tokens
            )
            if report is None or report.stale or not capacity:
                continue
            out.append((report.kv_usage, capacity))
        return out

    def engine_kv_tokens(self) -> int | None:
        """Engine-reported KV tokens in use, for the admission ledger to reconcile with."""
        kv = self._kv()
        return int(sum(usage * cap for usage, cap in kv)) if kv else None

    def engine_kv_capacity(self) -> int | None:
        """Measured cluster KV capacity (tokens), for the dynamic quota loop."""
        kv = self._kv()
        return sum(cap for _, cap in kv) if kv else None

    def has_pool(self, pool: str) -> bool:
        return any(s.pool == pool for s in self.specs.values())

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
        self.proxy = Proxy(
            session=self.session,
            router=self.router,
            node_url=self.node_url,
            flags=self.flags,
            metrics=self.metrics,
            max_retries=self.config.routing.max_retries,
            upstream_timeout_s=server.upstream_timeout_s,
            progress_batch_tokens=server.progress_batch_tokens,
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
        await self.admission.start()
        self.started_at = time.monotonic()
        log.info(
            "gateway %s up: %d node(s), policy=%s, store=%s",
            self.config.gateway_id,
            len(self.specs),
            self.config.routing.policy,
            self.config.store,
        )

    async def stop(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self.scraper:
            await self.scraper.stop()
        if self.node_registry:
            await self.node_registry.stop()
        await self.admission.stop()
        if self.proxy:
            self.proxy.close()
        if self.session:
            await self.session.close()
        if self._owns_store:
            await self.store.close()


def create_app(
    config: GatewayConfig,
    *,
    clock: Clock | None = None,
    store: KVStore | None = None,
    registry: CollectorRegistry | None = None,
) -> web.Application:
    from kvgate.gateway import admin, handlers

    gateway = Gateway(config, clock=clock, store=store, registry=registry)
    app = web.Application(
        middlewares=[access_middleware, error_middleware],
        client_max_size=config.server.max_body_bytes,
    )
    app[GATEWAY] = gateway
    handlers.add_routes(app)
    admin.add_routes(app)

    async def lifecycle(_: web.Application) -> AsyncIterator[None]:
        await gateway.start()
        yield
        await gateway.stop()

    app.cleanup_ctx.append(lifecycle)
    return app
