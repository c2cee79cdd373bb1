"""One structured log line and the request metrics per request (never the prompt text)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import asdict, dataclass

from aiohttp import web

from kvgate.gateway.errors import Handler
from kvgate.gateway.gateway import GATEWAY

CLIENT_CLOSED = 499  # nginx's code for "the client closed the request", in logs and metrics

access_log = logging.getLogger("kvgate.gateway.access")


@dataclass(slots=True)
class RequestLog:
    request_id: str = ""
    tenant: str | None = None
    node: str | None = None
    reason: str | None = None
    admission: str | None = None
    attempts: int = 0
    cached_tokens: int | None = None
    expected_cached_tokens: int | None = None


LOG_KEY: web.RequestKey[RequestLog] = web.RequestKey("kvgate_log", RequestLog)


def request_log(request: web.Request) -> RequestLog:
    entry = request.get(LOG_KEY)
    if entry is None:
        entry = RequestLog()
        request[LOG_KEY] = entry
    return entry


def endpoint_label(request: web.Request) -> str:
    info = request.match_info
    route = info.route if info is not None else None
    resource = route.resource if route is not None else None
    return resource.canonical if resource is not None else "unmatched"


@web.middleware
async def access_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    gateway = request.app[GATEWAY]
    metrics = gateway.metrics
    started = time.perf_counter()
    endpoint = endpoint_label(request)
    status = 500
    metrics.inflight.inc()
    try:
        response = await handler(request)
        status = response.status
        return response
    except asyncio.CancelledError:  # the client left (handler cancellation)
        status = CLIENT_CLOSED
        raise
    finally:
        metrics.inflight.dec()
        elapsed = time.perf_counter() - started
        metrics.child(metrics.requests, endpoint, str(status)).inc()
        if endpoint.startswith("/v1/"):
            metrics.child(metrics.request_duration, endpoint).observe(elapsed)
        if endpoint not in ("/metrics", "/health") and access_log.isEnabledFor(logging.INFO):
            entry = request_log(request)
            fields = {
                "method": request.method,
                "path": endpoint,
                "status": status,
                "latency_ms": round(elapsed * 1000, 2),
            }
            fields.update({k: v for k, v in asdict(entry).items() if v not in (None, "", 0)})
            access_log.info(json.dumps(fields, separators=(",", ":")))
