"""A proxy worker process of ``kvgate serve --workers N``.

It accepts client connections on the shared port (SO_REUSEPORT) and runs the same
handlers and the same ``Proxy`` byte path as a single-process gateway: body checks, the
tenant key, the prompt's route request (the CPU-heavy part) happen here, while every
decision (admission, routing, retries, ejection, release) is the decision owner's
``RequestPipeline``, reached through a ``RemotePipeline``. Everything else (/health,
/metrics, /admin, /v1/models, jobs, dashboard) is passed to the owner's own HTTP app
over a Unix socket.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import time
from typing import Any, cast

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from kvgate.admission.tenants import TenantDirectory
from kvgate.clock import SystemClock
from kvgate.flags import Flags
from kvgate.gateway import handlers
from kvgate.gateway.appkey import start_with_app
from kvgate.gateway.config import GatewayConfig, parse_config
from kvgate.gateway.errors import error_middleware, guard_edges
from kvgate.gateway.front import serve_app
from kvgate.gateway.gateway import GATEWAY
from kvgate.gateway.ipc import DecisionClient
from kvgate.gateway.logs import access_middleware
from kvgate.gateway.metrics import GatewayMetrics
from kvgate.gateway.proxy import Call, Proxy
from kvgate.gateway.remote import RemoteFlow, RemotePipeline
from kvgate.kv_events.hub import KvEventHub
from kvgate.routing.node_view import NodeView
from kvgate.tasks import serve_until_signalled
from kvgate.tracing import Tracing, configure

log = logging.getLogger("kvgate.gateway.worker")
METRICS_PUSH_S = 1.0
# a worker that goes idle pushes soon (tests and scrapes see finished requests at once),
# but never more often than this: a push (text exposition) costs ≈1–2 ms
IDLE_PUSH_DELAY_S = 0.02
MIN_PUSH_INTERVAL_S = 0.25
_HOP = frozenset(("connection", "keep-alive", "transfer-encoding", "content-length", "host"))


class WorkerGateway:
    """What a worker holds; handlers and middlewares reach it as ``app[GATEWAY]``."""

    def __init__(self, config: GatewayConfig, owner_http: str, owner_ipc: str) -> None:
        self.config = config
        self.registry = CollectorRegistry()
        self.metrics = GatewayMetrics(self.registry)
        self.flags = Flags(config.flags)
        self.tenants = TenantDirectory(config.admission)
        # without its owner a worker can decide nothing: it shuts down (no orphans)
        self.client = DecisionClient(
            on_lost=lambda: os.kill(os.getpid(), signal.SIGTERM),
            on_config=self.apply_config,
            on_metrics_wanted=self.push_metrics,
        )
        self.urls: dict[str, str] = {}
        self.pipeline = RemotePipeline(self.client, self.urls)
        # the request spans are this process's (the stage spans the owner's)
        self.tracing: Tracing | None = None
        # the engines' own prompt hashing (precise routing); the hub's sockets stay the
        # owner's: this one is never started and only hashes
        self.kv_events = KvEventHub(
            config.kv_events, NodeView(SystemClock(), config.routing), registry=CollectorRegistry()
        )
        self.owner_http = owner_http
        self.owner_ipc = owner_ipc
        self._models: list[str] = []
        self.session: aiohttp.ClientSession | None = None
        self.owner_session: aiohttp.ClientSession | None = None
        self.proxy: Proxy | None = None
        self._pusher: asyncio.Task[None] | None = None
        self.active = 0  # client requests in this worker now
        self._pushed_at = 0.0
        self._soon: asyncio.TimerHandle | None = None

    def apply_config(self, config: GatewayConfig) -> None:
        """The owner's running config (at connect, then on each version it applies)."""
        if config is self.config:
            return
        self.config = config
        self.tenants = TenantDirectory(config.admission)

    def push_metrics(self, asked: int = 0) -> None:
        """This worker's metrics to the owner (``asked``: the owner's request number)."""
        if self._soon is not None and not asked:
            self._soon.cancel()
        self._soon = None
        self._pushed_at = time.monotonic()
        self.client.tell("metrics", generate_latest(self.registry).decode(), asked, now=bool(asked))

    def request_ended(self) -> None:
        self.active -= 1
        if self.active or self._soon is not None:
            return
        wait = max(IDLE_PUSH_DELAY_S, self._pushed_at + MIN_PUSH_INTERVAL_S - time.monotonic())
        self._soon = asyncio.get_running_loop().call_later(wait, self.push_metrics)

    def models(self) -> list[str]:
        return self._models

    async def refresh_models(self) -> None:
        self._models = await self.client.call("models")

    async def remote_job(self, call: Call) -> web.Response:
        """An async job runs at the owner, with the flow it admitted."""
        flow = cast(RemoteFlow, call.flow)
        status, headers, payload = await self.client.call(
            "job", flow.key, call.path, call.endpoint, call.body
        )
        headers.pop("Content-Length", None)
        return web.Response(status=status, headers=headers, body=payload)

    async def start(self) -> None:
        self.tracing = configure(self.config.tracing)
        server = self.config.server
        self.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(sock_connect=server.connect_timeout_s)
        )
        self.owner_session = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=self.owner_http), auto_decompress=False
        )
        self.proxy = Proxy.configured(
            self.config,
            session=self.session,
            pipeline=self.pipeline,
            node_url=self.urls.get,
            metrics=self.metrics,
        )
        await self.client.connect(self.owner_ipc)
        await self.refresh_models()
        self._pusher = asyncio.get_running_loop().create_task(self._push())

    async def _push(self) -> None:
        """Metrics to the owner, and the owner's model list back, once a second."""
        while True:
            await asyncio.sleep(METRICS_PUSH_S)
            if time.monotonic() - self._pushed_at >= METRICS_PUSH_S / 2:
                self.push_metrics()
            try:
                await self.refresh_models()
            except Exception:  # the owner is going away; the next turn tries again
                log.debug("model list refresh failed", exc_info=True)

    async def stop(self) -> None:
        if self._pusher:
            self._pusher.cancel()
        if self._soon is not None:
            self._soon.cancel()
        self.push_metrics()
        await asyncio.sleep(0)
        if self.proxy:
            self.proxy.close()
        for session in (self.session, self.owner_session):
            if session:
                await session.close()
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.shutdown)
            self.tracing = None


@web.middleware
async def activity_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """Outermost: counts the worker's requests, so an idle worker pushes its metrics."""
    worker = cast(WorkerGateway, request.app[GATEWAY])
    worker.active += 1
    try:
        return cast(web.StreamResponse, await handler(request))
    finally:
        worker.request_ended()


@web.middleware
async def access_unless_owner(request: web.Request, handler: Any) -> web.StreamResponse:
    """The access log and request metrics, except for requests the owner answers (the
    owner's app counts those itself)."""
    if request.match_info.handler is to_owner:
        return cast(web.StreamResponse, await handler(request))
    return await access_middleware(request, handler)


async def generate(request: web.Request, endpoint: str) -> web.StreamResponse:
    worker = cast(WorkerGateway, request.app[GATEWAY])
    if not worker.models():  # nodes may have been added since the last refresh
        await worker.refresh_models()
    return await handlers.generate(request, endpoint)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await generate(request, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    return await generate(request, "completions")


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
    app = web.Application(
        middlewares=[activity_middleware, access_unless_owner, error_middleware],
        client_max_size=config.server.max_body_bytes,
    )
    app[GATEWAY] = cast(Any, worker)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_route("*", "/{tail:.*}", to_owner)
    guard_edges(app, worker.registry)
    start_with_app(app, worker)
    return app


def bind_port(host: str, port: int, *, reuse_port: bool) -> socket.socket:
    """A TCP socket bound to ``host:port`` (not listening yet)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def reuseport_socket(host: str, port: int) -> socket.socket:
    return bind_port(host, port, reuse_port=True)


async def _run(args: argparse.Namespace) -> None:
    config = parse_config(json.loads(args.config_json))
    app = create_worker_app(config, args.owner_http, args.owner_ipc)
    # a client that leaves cancels its handler, and with it its queue entry at the owner
    sock = reuseport_socket(config.server.host, args.port)
    runner, _site = await serve_app(app, sock=sock)
    with open(args.ready_file, "w") as f:
        f.write(str(os.getpid()))
    await serve_until_signalled(runner.cleanup)


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
