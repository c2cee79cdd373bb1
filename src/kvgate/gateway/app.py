"""The gateway application: one ``Gateway`` behind the HTTP routes and middlewares."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry

from kvgate.clock import Clock
from kvgate.gateway import admin, admin_config, handlers
from kvgate.gateway.appkey import start_with_app
from kvgate.gateway.config import GatewayConfig
from kvgate.gateway.errors import error_middleware, guard_edges
from kvgate.gateway.gateway import GATEWAY, Gateway
from kvgate.gateway.logs import access_middleware
from kvgate.store.base import KVStore


def create_app(
    config: GatewayConfig,
    *,
    clock: Clock | None = None,
    store: KVStore | None = None,
    registry: CollectorRegistry | None = None,
) -> web.Application:
    gateway = Gateway(config, clock=clock, store=store, registry=registry)
    app = web.Application(
        middlewares=[access_middleware, error_middleware],
        client_max_size=config.server.max_body_bytes,
    )
    app[GATEWAY] = gateway
    handlers.add_routes(app)
    admin.add_routes(app)
    guard_edges(app, gateway.registry)
    start_with_app(app, gateway)
    admin_config.install(app)  # config versions + capacity profiles (after gateway.start)
    return app


__all__ = ["GATEWAY", "Gateway", "create_app"]
