"""A lean HTTP/1.1 front for the generate endpoints; every other request is aiohttp's.

aiohttp's server spends, per request, a task per connection woken by a future per
message, a second task per request, a ``Request`` with its payload stream, a router
lookup and the middleware wrapping: on a streamed long-prompt request ≈ 8–10% of the
gateway's CPU. This front is an asyncio ``Protocol`` that takes only the plain form of
the hot requests — ``POST /v1/chat/completions`` or ``POST /v1/completions`` over
HTTP/1.1 with one ``Content-Length`` body within the size limit, printable ASCII
headers, no ``Transfer-Encoding``, ``Content-Encoding``, ``Expect``, ``Upgrade``,
``Proxy-Connection`` or ``Connection`` other than keep-alive — and runs the app's own
route handler and middlewares on it (one task per request), answering with aiohttp's
own response objects and ``StreamWriter``, so the bytes on the wire are aiohttp's.
``tests/gateway/test_front_differential.py`` holds it to aiohttp's parser on hostile
input.

Anything else (another path or method, a chunked or encoded body, a head it would have
to judge) hands the connection to aiohttp's server for good: the protocol is swapped on
the transport and aiohttp's parser is fed every byte from the start of that request, so
it answers exactly as without the front. ``server.lean_front: false`` turns it off.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import socket
from collections.abc import Awaitable, Callable
from typing import Any, Literal, cast

from aiohttp import ClientConnectionResetError, HttpVersion11, web
from aiohttp.base_protocol import BaseProtocol
from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE
from aiohttp.http_writer import StreamWriter
from aiohttp.tcp_helpers import tcp_nodelay
from aiohttp.web_urldispatcher import UrlMappingMatchInfo
from multidict import CIMultiDict, CIMultiDictProxy

from kvgate.gateway.gateway import GATEWAY

log = logging.getLogger("kvgate.gateway")

HOT_PATHS = ("/v1/chat/completions", "/v1/completions")
_MAX_HEAD = 8190  # aiohttp's line limit: a longer head is aiohttp's to judge
_KEEPALIVE_S = 75.0  # aiohttp's keep-alive timeout (AppRunner's default)
# a head of tokens and printable ASCII values only (anything else: aiohttp's parser)
_HEADER_LINES = re.compile(rb"(?:[!#$%&'*+.^_`|~0-9A-Za-z-]+:[\t\x20-\x7e]*\r\n)*")
# the start of such a head: whole lines, then the start of a line or of the blank one
_HEADER_START = re.compile(
    rb"(?:[!#$%&'*+.^_`|~0-9A-Za-z-]+:[\t\x20-\x7e]*\r\n)*"
    rb"(?:[!#$%&'*+.^_`|~0-9A-Za-z-]+(?::[\t\x20-\x7e]*\r?)?|\r)?"
)
# headers whose presence sends the request to aiohttp (Connection: see _plain);
# Proxy-Connection: aiohttp's C parser (llhttp) reads it as Connection
_NOT_PLAIN = frozenset(
    (
        "transfer-encoding",
        "content-encoding",
        "expect",
        "upgrade",
        "sec-websocket-key1",
        "proxy-connection",
    )
)
_MAX_HEADERS = 100  # aiohttp refuses more than 128

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_Parsed = tuple["_Route", CIMultiDictProxy[str], int, int]  # route, headers, body at, length


class _Route:
    __slots__ = ("handler", "match_info", "path", "signals")

    def __init__(self, app: web.Application, path: str, route: web.AbstractRoute) -> None:
        self.path = path
        info = UrlMappingMatchInfo({}, route)
        info.add_app(app)
        info.freeze()
        self.match_info = info
        self.signals = any(app.on_response_prepare for app in info.apps)
        handler: Any = route.handler
        for middleware in reversed(app.middlewares):  # as aiohttp wraps them
            handler = functools.update_wrapper(
                functools.partial(middleware, handler=handler), handler
            )
        self.handler: Handler = handler


def _post_route(app: web.Application, path: str) -> web.AbstractRoute | None:
    for resource in app.router.resources():
        if resource.canonical == path:
            for route in resource:
                if route.method == "POST":
                    return route
    return None


class Front:
    """The protocol factory of one listening socket: the hot routes, aiohttp's server for
    the rest, and the live connections (for shutdown)."""

    def __init__(self, app: web.Application, fallback: web.Server, *, max_body: int) -> None:
        self.app = app
        self.fallback = fallback
        self.max_body = max_body
        self.routes: dict[bytes, _Route] = {}
        for path in HOT_PATHS:
            route = _post_route(app, path)
            if route is not None:
                self.routes[f"POST {path} HTTP/1.1".encode()] = _Route(app, path, route)
        metrics = app[GATEWAY].metrics
        self.served = metrics.front_requests
        self.handovers = metrics.front_handovers
        self.connections: set[FrontConnection] = set()
        self.closing = False

    def __call__(self) -> FrontConnection:
        return FrontConnection(self)

    async def shutdown(self, timeout_s: float) -> None:
        """Close idle connections; give running requests ``timeout_s``, then cancel them."""
        self.closing = True
        tasks = []
        for conn in list(self.connections):
            if conn.task is None:
                conn.close()
            else:
                tasks.append(conn.task)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout_s)
            for task in pending:
                task.cancel()
        for conn in list(self.connections):
            conn.close()


class FrontRequest:
    """What the handlers, middlewares and aiohttp's responses read of a request."""

    __slots__ = (
        "_body",
        "_conn",
        "_state",
        "_writer",
        "app",
        "content_length",
        "gone",
        "headers",
        "match_info",
        "path",
        "route",
        "transport",
    )
    method = "POST"
    version = HttpVersion11
    keep_alive = True

    def __init__(
        self,
        conn: FrontConnection,
        route: _Route,
        headers: CIMultiDictProxy[str],
        body: bytes,
    ) -> None:
        self.app = conn.front.app
        self.route = route
        self.path = route.path
        self.match_info = route.match_info
        self.headers = headers
        self.content_length = len(body)
        self.transport = conn.transport
        self._body = body
        self.gone = False
        self._state: dict[Any, Any] = {}
        self._conn = conn
        self._writer: StreamWriter | None = None

    @property
    def _payload_writer(self) -> StreamWriter:
        """aiohttp's writer for a response the front did not write itself (made on use)."""
        if self._writer is None:
            self._writer = StreamWriter(self._conn, self._conn._loop)
        return self._writer

    async def read(self) -> bytes:
        if self.gone:  # the client left before its body was in (as a cancelled handler)
            raise asyncio.CancelledError
        return self._body

    def open_stream(self, headers: dict[str, str], first: bytes) -> FrontStream | None:
        """A 200 event stream's head and first events in one write, as aiohttp's
        ``StreamResponse`` would send them (None: let it; a response-prepare signal or a
        header it would refuse)."""
        transport = self.transport
        if self.route.signals or transport is None or transport.is_closing():
            return None
        head = "\r\n".join([f"{name}: {value}" for name, value in headers.items()])
        if head.count("\n") != len(headers) - 1 or head.count("\r") != len(headers) - 1:
            return None  # a CR or LF inside a name or value: aiohttp refuses it
        data = (
            f"HTTP/1.1 200 OK\r\n{head}\r\nContent-Type: text/event-stream\r\n"
            f"Transfer-Encoding: chunked\r\nDate: {rfc822_formatted_time()}\r\n"
            f"Server: {SERVER_SOFTWARE}\r\n\r\n"
        ).encode()
        if first:
            data += b"%x\r\n%b\r\n" % (len(first), first)
        transport.write(data)
        return FrontStream(transport, headers)

    async def _prepare_hook(self, response: web.StreamResponse) -> None:
        for app in self.match_info.apps:
            if signal := app.on_response_prepare:
                await signal.send(cast(web.Request, self), response)

    def get(self, key: Any, default: Any = None) -> Any:
        return self._state.get(key, default)

    def __getitem__(self, key: Any) -> Any:
        return self._state[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        self._state[key] = value

    def __contains__(self, key: Any) -> bool:
        return key in self._state


class FrontStream:
    """A streamed answer whose head the front wrote: what the proxy, the middlewares and
    the front use of aiohttp's ``StreamResponse`` (chunked writes, the end, status)."""

    __slots__ = ("_eof", "_transport", "headers")
    status = 200
    keep_alive = True
    prepared = True

    def __init__(self, transport: asyncio.Transport, headers: dict[str, str]) -> None:
        self._transport = transport
        self._eof = False
        self.headers = {**headers, "Content-Type": "text/event-stream"}
        self.headers["Transfer-Encoding"] = "chunked"

    async def prepare(self, request: Any) -> None:
        return None

    def _write(self, data: bytes) -> None:
        if self._transport.is_closing():
            raise ClientConnectionResetError("Cannot write to closing transport")
        self._transport.write(data)

    async def write(self, data: bytes) -> None:
        if self._eof:
            raise RuntimeError("Cannot call write() after write_eof()")
        if data:
            self._write(b"%x\r\n%b\r\n" % (len(data), data))

    async def write_eof(self, data: bytes = b"") -> None:
        if self._eof:
            return
        self._eof = True
        chunk = b"%x\r\n%b\r\n" % (len(data), data) if data else b""
        self._write(chunk + b"0\r\n\r\n")


def _plain(lines: bytes) -> tuple[CIMultiDictProxy[str], int] | None:
    """(headers, Content-Length) of a head this front takes, else None (aiohttp's).

    What aiohttp's parser would refuse or treat specially is never taken: a missing
    ``Host``, a repeated header name (aiohttp refuses some repeats), too many headers."""
    if _HEADER_LINES.fullmatch(lines) is None:
        return None
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    length = -1
    for line in lines.decode("ascii").split("\r\n")[:-1]:
        name, _, value = line.partition(":")
        value = value.strip(" \t")
        lower = name.lower()
        if lower in seen or lower in _NOT_PLAIN:
            return None  # a coding, Expect, Upgrade, a second Content-Length …
        seen.add(lower)
        if lower == "content-length":
            if not value.isdigit():
                return None
            length = int(value)
        elif lower == "connection" and value.lower() != "keep-alive":
            return None
        pairs.append((name, value))
    if length < 0 or "host" not in seen or len(pairs) > _MAX_HEADERS:
        return None
    return CIMultiDictProxy(CIMultiDict(pairs)), length


class FrontConnection(BaseProtocol):
    """One client connection, until (if ever) it is handed to aiohttp's server."""

    __slots__ = ("_buf", "_idle_since", "_keepalive", "front", "task")

    def __init__(self, front: Front) -> None:
        super().__init__(asyncio.get_running_loop())
        self.front = front
        self.task: asyncio.Task[None] | None = None
        self._buf = b""
        self._idle_since = self._loop.time()
        self._keepalive: asyncio.TimerHandle | None = None

    # -- protocol callbacks ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        tcp_nodelay(cast(asyncio.Transport, transport), True)
        self.front.connections.add(self)
        self._keepalive = self._loop.call_later(_KEEPALIVE_S, self._check_idle)

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        self.front.connections.discard(self)
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
        if self.task is not None:  # the client left: its handler goes (and all it started)
            self.task.cancel()
        elif self._buf:
            self._left_during_body()

    def data_received(self, data: bytes) -> None:
        self._buf = self._buf + data if self._buf else data
        if self.task is None:
            self._idle_since = self._loop.time()
            self._next()
        elif len(self._buf) > self.front.max_body and not self._reading_paused:
            self._reading_paused = True  # pipelined bytes pile up: wait for the handler
            self._pause_transport_reading()

    # -- requests -------------------------------------------------------------------------
    def _next(self) -> None:
        head = self._head()
        if head is None:
            return  # more of the head is on its way
        if not isinstance(head, tuple):
            self._handover()
            return
        route, headers, start, length = head
        buf = self._buf
        if len(buf) < start + length:
            return  # the rest of the body is on its way
        body = buf[start : start + length]
        self._buf = buf[start + length :]
        request = FrontRequest(self, route, headers, body)
        self.task = self._loop.create_task(self._serve(request, route))

    def _head(self) -> _Parsed | Literal[False] | None:
        """(route, headers, body start, body length) of the buffered request's head;
        None while it is incomplete and may still be plain; False for a request that is
        aiohttp's (as soon as the bytes in show it: aiohttp refuses a bad head at once)."""
        buf = self._buf
        line_end = buf.find(b"\r\n")
        if line_end < 0:
            if any((line + b"\r\n").startswith(buf) for line in self.front.routes):
                return None
            return False
        route = self.front.routes.get(buf[:line_end])
        if route is None or self.front.closing:
            return False
        end = buf.find(b"\r\n\r\n", line_end)
        if end < 0:
            start = buf[line_end + 2 :]
            if (
                len(buf) > _MAX_HEAD
                or start.count(b"\n") > _MAX_HEADERS
                or _HEADER_START.fullmatch(start) is None
            ):
                return False
            return None
        if end > _MAX_HEAD:
            return False
        plain = _plain(buf[line_end + 2 : end + 2])
        if plain is None or plain[1] > self.front.max_body:
            return False
        return route, plain[0], end + 4, plain[1]

    def _left_during_body(self) -> None:
        """aiohttp starts a request's handler once its head is in, so a client that
        leaves while sending the body has its handler cancelled: counted and logged as
        499. The same here, for a head the front had taken."""
        head = self._head()
        if not isinstance(head, tuple):
            return
        route, headers, _, _ = head
        request = FrontRequest(self, route, headers, b"")
        request.gone = True
        self._buf = b""
        self.task = self._loop.create_task(self._serve(request, route))

    async def _serve(self, request: FrontRequest, route: _Route) -> None:
        keep = False
        req = cast(web.Request, request)
        try:
            try:
                response = await route.handler(req)
            except web.HTTPException as exc:  # as aiohttp's server: the exception answers
                response = exc
            except Exception as exc:  # the middlewares answer everything: a last resort
                log.error("unhandled error in the lean front", exc_info=exc)
                response = web.Response(
                    status=500, text="500 Internal Server Error\n\nServer got itself in trouble"
                )
                response.force_close()
            await response.prepare(req)
            await response.write_eof()
            self.front.served.inc()
            keep = bool(response.keep_alive)
        except ConnectionError:
            pass  # the client went away while the answer was written
        except Exception as exc:
            log.error("lean front: the answer could not be written", exc_info=exc)
        finally:
            self.task = None
        if not keep or self.transport is None or self.front.closing:
            self.close()
            return
        self._idle_since = self._loop.time()
        if self._reading_paused:
            self._reading_paused = False
            self._resume_transport_reading()
        if self._buf:
            self._next()

    def _handover(self) -> None:
        """From this request on, the connection is aiohttp's."""
        transport = self.transport
        if transport is None:
            return
        self.front.connections.discard(self)
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
        self.front.handovers.inc()
        handler = self.front.fallback()
        transport.set_protocol(handler)
        handler.connection_made(transport)
        if self._reading_paused:
            self._reading_paused = False
            self._resume_transport_reading()
        buf, self._buf = self._buf, b""
        self.transport = None
        if buf:
            handler.data_received(buf)

    def _check_idle(self) -> None:
        """aiohttp's keep-alive rule: an idle connection closes after 75 s."""
        self._keepalive = None
        if self.transport is None:
            return
        if self.task is None:
            left = self._idle_since + _KEEPALIVE_S - self._loop.time()
            if left <= 0:
                self.close()
                return
        else:
            left = _KEEPALIVE_S
        self._keepalive = self._loop.call_later(left, self._check_idle)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class FrontSite(web.BaseSite):
    """An aiohttp site whose connections meet the lean front first (host/port or a socket)."""

    __slots__ = ("_host", "_name", "_port", "_sock", "front")

    def __init__(
        self,
        runner: web.AppRunner,
        *,
        max_body: int,
        host: str = "127.0.0.1",
        port: int = 0,
        sock: socket.socket | None = None,
        backlog: int = 128,
    ) -> None:
        super().__init__(runner, backlog=backlog)
        assert runner.server is not None
        self.front = Front(runner.app, runner.server, max_body=max_body)
        self._host, self._port, self._sock = host, port, sock
        if sock is not None:
            host, port = sock.getsockname()[:2]
        self._name = f"http://{host}:{port}"

    @property
    def name(self) -> str:
        return self._name

    async def start(self) -> None:
        self._runner._reg_site(self)
        loop = asyncio.get_running_loop()
        if self._sock is not None:
            self._server = await loop.create_server(
                self.front, sock=self._sock, backlog=self._backlog
            )
        else:
            self._server = await loop.create_server(
                self.front, self._host, self._port, backlog=self._backlog, reuse_address=True
            )

    async def stop(self) -> None:
        await super().stop()
        await self.front.shutdown(self._runner._shutdown_timeout)


async def start_site(
    runner: web.AppRunner,
    *,
    lean: bool,
    max_body: int,
    host: str = "127.0.0.1",
    port: int = 0,
    sock: socket.socket | None = None,
    backlog: int = 1024,
) -> web.BaseSite:
    """Listen for ``runner``'s app: through the lean front, or aiohttp's plain server."""
    site: web.BaseSite
    if lean:
        site = FrontSite(
            runner, max_body=max_body, host=host, port=port, sock=sock, backlog=backlog
        )
    elif sock is not None:
        site = web.SockSite(runner, sock, backlog=backlog)
    else:
        site = web.TCPSite(runner, host, port, backlog=backlog)
    await site.start()
    return site


async def serve_app(
    app: web.Application,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    sock: socket.socket | None = None,
    backlog: int = 1024,
    shutdown_timeout_s: float = 5.0,
) -> tuple[web.AppRunner, web.BaseSite]:
    """Serve a gateway app (its own process or a proxy worker) as its ``server`` config
    says. A client that leaves cancels its handler (``handler_cancellation``), so the
    upstream request and any admission-queue entry go with it."""
    runner = web.AppRunner(
        app, access_log=None, shutdown_timeout=shutdown_timeout_s, handler_cancellation=True
    )
    await runner.setup()
    server = app[GATEWAY].config.server
    site = await start_site(
        runner,
        lean=server.lean_front,
        max_body=server.max_body_bytes,
        host=host,
        port=port,
        sock=sock,
        backlog=backlog,
    )
    return runner, site


__all__ = [
    "Front",
    "FrontConnection",
    "FrontRequest",
    "FrontSite",
    "FrontStream",
    "serve_app",
    "start_site",
]
