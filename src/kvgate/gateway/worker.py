"""A proxy worker process of ``kvgate serve --workers N``.

It accepts client connections on the shared port (SO_REUSEPORT), parses and checks each
generate request itself (body, tenant key, prompt → route request: the CPU-heavy part),
asks the decision owner once (``begin``) and streams the answer through the same
``Proxy`` byte path as a single-process gateway, with a ``RemoteRouter`` standing in for
the router. Everything else (/health, /metrics, /admin, /v1/models, jobs, dashboard) is
passed to the owner's own HTTP app over a Unix socket.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import signal
import socket
import time
import uuid
from typing import Any, cast

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from kvgate.admission.tenants import PriorityNotAllowed, TenantDirectory
from kvgate.flags import Flags
from kvgate.gateway.app import GATEWAY
from kvgate.gateway.config import GatewayConfig, parse_config
from kvgate.gateway.decisions import Begin, DecisionClient, Plan
from kvgate.gateway.errors import ApiError, error_middleware
from kvgate.gateway.handlers import (
    CLASS_HEADER,
    ENDPOINT_PATHS,
    PRIORITY_HEADER,
    _log_call,
    _prompt_error,
    identify_tenant,
    read_json_body,
    requested_priority,
    validate_body,
)
from kvgate.gateway.logs import access_middleware, request_log
from kvgate.gateway.metrics import GatewayMetrics
from kvgate.gateway.proxy import Call, Proxy
from kvgate.prompts import PromptError
from kvgate.routing import build_route_request
from kvgate.types import NoNodeAvailable, RouteDecision, RouteRequest

log = logging.getLogger("kvgate.gateway.worker")
METRICS_PUSH_S = 1.0
_HOP = frozenset(("connection", "keep-alive", "transfer-encoding", "content-length", "host"))


class RemoteRouter:
    """The Router interface the Proxy uses, answered from the owner's plan."""

    def __init__(self, worker: WorkerGateway) -> None:
        self.worker = worker
        self.plans: dict[int, tuple[int, Plan]] = {}  # id(route) → (key, plan)

    def route(self, req: RouteRequest, *, exclude: Any = ()) -> RouteDecision:
        _, plan = self.plans[id(req)]
        if plan.decision is None:
            raise NoNodeAvailable(plan.no_node or "no node")
        if not exclude:
            return plan.decision
        for node in plan.alternates:
            if node not in exclude:
                return RouteDecision(node, "retry", 0, plan.decision.policy)
        raise NoNodeAvailable("no alternate node left")

    def on_dispatch(self, req: RouteRequest, decision: RouteDecision) -> None:
        key, plan = self.plans[id(req)]
        if decision is plan.decision:
            return  # the owner counted the first attempt when it decided
        self.worker.client.tell("dispatch", key, decision.node_id, decision.reason)

    def on_progress(self, req: RouteRequest, decision: RouteDecision, generated: int) -> None:
        key, _ = self.plans[id(req)]
        self.worker.client.tell("progress", key, decision.node_id, generated)

    def on_complete(
        self,
        req: RouteRequest,
        decision: RouteDecision,
        *,
        ok: bool,
        actual_cached_tokens: int | None,
        output_tokens: int,
    ) -> None:
        key, _ = self.plans[id(req)]
        self.worker.client.tell(
            "complete", key, decision.node_id, ok, actual_cached_tokens, output_tokens
        )


class WorkerGateway:
    """What a worker holds; handlers and middlewares reach it as ``app[GATEWAY]``."""

    def __init__(self, config: GatewayConfig, owner_http: str, owner_ipc: str) -> None:
        self.config = config
        self.registry = CollectorRegistry()
        self.metrics = GatewayMetrics(self.registry)
        self.flags = Flags(config.flags)
        self.tenants = TenantDirectory(config.admission)
        # without its owner a worker can decide nothing: it shuts down (no orphans)
        self.client = DecisionClient(on_lost=lambda: os.kill(os.getpid(), signal.SIGTERM))
        self.router = RemoteRouter(self)
        self.urls: dict[str, str] = {}
        self.owner_http = owner_http
        self.owner_ipc = owner_ipc
        self.keys = itertools.count(1)
        self.session: aiohttp.ClientSession | None = None
        self.owner_session: aiohttp.ClientSession | None = None
        self.proxy: Proxy | None = None
        self._pusher: asyncio.Task[None] | None = None

    async def start(self) -> None:
        server = self.config.server
        self.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(sock_connect=server.connect_timeout_s)
        )
        self.owner_session = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=self.owner_http), auto_decompress=False
        )
        self.proxy = Proxy(
            session=self.session,
            router=self.router,  # type: ignore[arg-type]
            node_url=self.urls.get,
            flags=self.flags,
            metrics=self.metrics,
            max_retries=self.config.routing.max_retries,
            upstream_timeout_s=server.upstream_timeout_s,
            progress_batch_tokens=server.progress_batch_tokens,
        )
        await self.client.connect(self.owner_ipc)
        self._pusher = asyncio.get_running_loop().create_task(self._push_metrics())

    async def _push_metrics(self) -> None:
        while True:
            await asyncio.sleep(METRICS_PUSH_S)
            self.client.tell("metrics", generate_latest(self.registry).decode())

    async def stop(self) -> None:
        if self._pusher:
            self._pusher.cancel()
        self.client.tell("metrics", generate_latest(self.registry).decode())
        await asyncio.sleep(0)
        if self.proxy:
            self.proxy.close()
        for session in (self.session, self.owner_session):
            if session:
                await session.close()


async def generate(request: web.Request, endpoint: str) -> web.StreamResponse:
    worker = cast(WorkerGateway, request.app[GATEWAY])
    started = time.perf_counter()
    request_id = request.headers.get("X-Request-Id") or f"req-{uuid.uuid4().hex[:16]}"
    entry = request_log(request)
    entry.request_id = request_id
    body, raw = await read_json_body(request, worker.config.server.max_body_bytes)
    validate_body(body, endpoint)
    tenant = identify_tenant(cast(Any, worker), request)
    entry.tenant = tenant.name
    try:
        priority = worker.tenants.resolve_priority(tenant, requested_priority(request, body))
    except PriorityNotAllowed as exc:
        raise ApiError(403, str(exc), param=PRIORITY_HEADER, code="priority_not_allowed") from None
    try:
        route = build_route_request(
            body,
            endpoint=endpoint,
            headers=request.headers,
            request_id=request_id,
            tenant=tenant.name,
            priority=priority,
            config=worker.config.routing.route_key,
        )
    except PromptError as exc:
        raise _prompt_error(exc) from None
    model = body.get("model")
    key = next(worker.keys)
    wants_async = "respond-async" in request.headers.get("Prefer", "").lower()
    plan: Plan = await worker.client.call(
        "begin",
        Begin(
            key=key,
            route=route,
            model=model if isinstance(model, str) else None,
            tenant=tenant.name,
            priority_min=tenant.priority_min,
            priority_class=request.headers.get(CLASS_HEADER) or tenant.default_class,
            wants_async=wants_async,
        ),
    )
    entry.admission = plan.admission
    path = ENDPOINT_PATHS[endpoint]
    if plan.async_job:
        status, headers, payload = await worker.client.call(
            "job", key, path, endpoint, {**body, "stream": False}
        )
        headers.pop("Content-Length", None)
        return web.Response(status=status, headers=headers, body=payload)
    worker.urls.update(plan.urls)
    call = Call(
        request_id=request_id,
        path=path,
        endpoint=endpoint,
        body=body,
        route=route,
        started=started,
        headers={"X-KVGate-Admission": plan.admission},
        raw_body=raw,
    )
    call.on_progress = _no_progress  # progress travels with the router's message
    worker.router.plans[id(route)] = (key, plan)
    try:
        assert worker.proxy is not None
        return await worker.proxy.forward(call, request)
    finally:
        worker.router.plans.pop(id(route), None)
        # written at once, with the queued ``complete``, microseconds after the answer's
        # last bytes: the owner applies both before the client can ask it anything else
        worker.client.tell("release", key, now=True)
        _log_call(entry, call)


async def _no_progress(_: int) -> None:
    return None


def _wrapped(endpoint: str) -> Any:
    async def handler(request: web.Request) -> web.StreamResponse:
        async def inner(r: web.Request) -> web.StreamResponse:
            return await error_middleware(r, lambda rr: generate(rr, endpoint))

        return await access_middleware(request, inner)

    return handler


async def to_owner(request: web.Request) -> web.StreamResponse:
    """Any other request: the owner's app answers it."""
    worker = cast(WorkerGateway, request.app[GATEWAY])
    assert worker.owner_session is not None
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
    data = await request.read()
    async with worker.owner_session.request(
        request.method, "http://owner" + request.path_qs, headers=headers, data=data
    ) as resp:
        payload = await resp.read()
        out = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP}
        return web.Response(status=resp.status, headers=out, body=payload)


def create_worker_app(config: GatewayConfig, owner_http: str, owner_ipc: str) -> web.Application:
    worker = WorkerGateway(config, owner_http, owner_ipc)
    app = web.Application(client_max_size=config.server.max_body_bytes)
    app[GATEWAY] = cast(Any, worker)
    app.router.add_post("/v1/chat/completions", _wrapped("chat"))
    app.router.add_post("/v1/completions", _wrapped("completions"))
    app.router.add_route("*", "/{tail:.*}", to_owner)

    async def lifecycle(_: web.Application) -> Any:
        await worker.start()
        yield
        await worker.stop()

    app.cleanup_ctx.append(lifecycle)
    return app


def reuseport_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


async def _run(args: argparse.Namespace) -> None:
    config = parse_config(json.loads(args.config_json))
    app = create_worker_app(config, args.owner_http, args.owner_ipc)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    sock = reuseport_socket(config.server.host, args.port)
    site = web.SockSite(runner, sock, backlog=1024)
    await site.start()
    with open(args.ready_file, "w") as f:
        f.write(str(os.getpid()))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description="kvgate proxy worker (started by kvgate serve)")
    parser.add_argument("--config-json", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--owner-http", required=True)
    parser.add_argument("--owner-ipc", required=True)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--ready-file", required=True, help="written once listening")
    args = parser.parse_args()
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s[w] %(message)s",
    )
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    asyncio.run(_run(args))


if __name__ == "__main__":
    main()
