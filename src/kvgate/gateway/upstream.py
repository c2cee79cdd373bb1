"""HTTP/1.1 to the engines at the asyncio protocol level, with keep-alive pooling.

Below aiohttp's client on purpose: a streamed answer's body bytes are de-chunked inside
``data_received`` and handed to a synchronous sink (the SSE relay), which writes them to
the client's transport in the same callback. No per-chunk coroutine, future or
StreamReader copy is involved; only the response head and the end wake a coroutine.

One ``Exchange`` per request: ``await exchange.head()`` gives status and headers; then
either ``await exchange.read()`` (whole body) or ``exchange.attach(sink)`` followed by
``await exchange.finished()``. A connection goes back to the pool only after a complete,
keep-alive response.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

_HEAD, _BODY, _DONE = 0, 1, 2
_MAX_HEAD = 64 * 1024


class UpstreamError(Exception):
    """The exchange failed; ``kind`` says how (connect | disconnected | read | protocol)."""

    def __init__(self, kind: str, message: str, *, before_response: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        # nothing of the response arrived: a stale pooled connection may be retried
        self.before_response = before_response


@dataclass(slots=True)
class Head:
    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)

    def get(self, name: str) -> str | None:
        lower = name.lower()
        for key, value in self.headers:
            if key.lower() == lower:
                return value
        return None

    @property
    def content_type(self) -> str:
        value = self.get("Content-Type") or ""
        return value.split(";", 1)[0].strip().lower()


Sink = Callable[[bytes], None]


class Exchange(asyncio.Protocol):
    """One TCP connection to an engine; carries one request/response at a time."""

    def __init__(self, pool: UpstreamPool, key: tuple[str, int]) -> None:
        self.pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.reused = False
        self._loop = asyncio.get_running_loop()
        self._reset()

    def _reset(self) -> None:
        self._state = _HEAD
        self._buf = b""
        self._head: Head | None = None
        self._head_waiter: asyncio.Future[Head] = self._loop.create_future()
        self._done_waiter: asyncio.Future[None] = self._loop.create_future()
        self._sink: Sink | None = None
        self._early: list[bytes] = []
        self._chunked = False
        self._remaining = -1  # content-length bytes left; -1: until the connection closes
        self._chunk_left = 0
        self._after_chunk = False  # the CRLF closing a chunk's data is still due
        self._trailers = False
        self._keep_alive = True
        self._any = False

    # -- protocol callbacks ---------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.pool.forget(self)
        if self._state == _BODY and not self._chunked and self._remaining < 0:
            self._finish()  # body delimited by the connection's end
            return
        if self._state != _DONE:
            before = not self._any
            kind = "disconnected" if self._state == _HEAD else "read"
            self._fail(
                UpstreamError(
                    kind, f"engine closed the connection ({exc or 'EOF'})", before_response=before
                )
            )

    def data_received(self, data: bytes) -> None:
        if self._state == _BODY:  # (_any is already set: the head came first)
            self._body(data)
        elif self._state == _HEAD:
            self._any = True
            self._head_bytes(data)

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost decides what it means

    # -- parsing ----------------------------------------------------------------------
    def _head_bytes(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > _MAX_HEAD:
                self._protocol_error("response head too large")
            self._buf = buf
            return
        self._buf = b""
        try:
            head = _parse_head(buf[:end])
        except ValueError as exc:
            self._protocol_error(str(exc))
            return
        self._head = head
        self._keep_alive = (head.get("Connection") or "").lower() != "close"
        encoding = (head.get("Transfer-Encoding") or "").lower()
        length = head.get("Content-Length")
        self._state = _BODY
        if "chunked" in encoding:
            self._chunked = True
        elif length is not None:
            self._remaining = int(length)
        elif head.status in (204, 304) or 100 <= head.status < 200:
            self._remaining = 0
        else:
            self._keep_alive = False
        if not self._head_waiter.done():
            self._head_waiter.set_result(head)
        rest = buf[end + 4 :]
        if rest or self._remaining == 0:
            self._body(rest)

    def _body(self, data: bytes) -> None:
        if not self._chunked:
            if self._remaining >= 0:
                data = data[: self._remaining]
                self._remaining -= len(data)
            if data:
                self._emit(data)
            if self._remaining == 0:
                self._finish()
            return
        if not (self._buf or self._chunk_left or self._after_chunk or self._trailers):
            # fast path: the read holds exactly one whole chunk (the usual SSE event)
            eol = data.find(b"\r\n")
            if 0 < eol < 10:
                try:
                    size = int(data[:eol], 16)
                except ValueError:
                    size = 0
                end = eol + 2 + size
                if size and len(data) == end + 2 and data.endswith(b"\r\n"):
                    self._emit(data[eol + 2 : end])
                    return
        buf = self._buf + data if self._buf else data
        pos, n = 0, len(buf)
        out: list[bytes] = []
        while pos < n:
            if self._chunk_left:
                take = min(self._chunk_left, n - pos)
                out.append(buf[pos : pos + take])
                pos += take
                self._chunk_left -= take
                if not self._chunk_left:
                    self._after_chunk = True
                continue
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            line = buf[pos:eol]
            pos = eol + 2
            if self._after_chunk:
                self._after_chunk = False
                if line:
                    self._protocol_error("bad chunk terminator")
                    return
                continue
            if self._trailers:
                if not line:
                    self._buf = b""
                    if out:
                        self._emit(b"".join(out))
                    self._finish()
                    return
                continue
            try:
                size = int(line.split(b";", 1)[0], 16)
            except ValueError:
                self._protocol_error("bad chunk size")
                return
            if size == 0:
                self._trailers = True
            self._chunk_left = size
        self._buf = buf[pos:]
        if out:
            self._emit(out[0] if len(out) == 1 else b"".join(out))

    def _emit(self, data: bytes) -> None:
        if self._sink is not None:
            self._sink(data)
        else:
            self._early.append(data)

    def _finish(self) -> None:
        self._state = _DONE
        if not self._done_waiter.done():
            self._done_waiter.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        for waiter in (self._head_waiter, self._done_waiter):
            if not waiter.done():
                waiter.set_exception(exc)
                waiter.exception()  # mark retrieved: only one of the two is awaited
        self._state = _DONE
        self._keep_alive = False

    def _protocol_error(self, message: str) -> None:
        self._fail(UpstreamError("protocol", f"bad HTTP from engine: {message}"))
        self.abort()

    # -- the consumer's side ----------------------------------------------------------
    def send(self, request: bytes) -> None:
        assert self.transport is not None
        self.transport.write(request)

    async def head(self) -> Head:
        return await self._head_waiter

    @property
    def head_future(self) -> asyncio.Future[Head]:
        """Resolves with the response head (or the exchange's failure)."""
        return self._head_waiter

    @property
    def done_future(self) -> asyncio.Future[None]:
        """Resolves when the response has ended (or with the exchange's failure)."""
        return self._done_waiter

    def attach(self, sink: Sink) -> None:
        """Route body bytes to ``sink`` from now on (bytes already read go first)."""
        self._sink = sink
        early, self._early = self._early, []
        for data in early:
            sink(data)

    def take_early(self) -> bytes:
        early, self._early = self._early, []
        return b"".join(early)

    def on_end(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the response has ended or failed."""
        self._done_waiter.add_done_callback(lambda _: callback())

    async def finished(self) -> None:
        await self._done_waiter

    @property
    def complete(self) -> bool:
        return (
            self._state == _DONE and self._done_waiter.done() and not self._done_waiter.exception()
        )

    async def read(self) -> bytes:
        await self._done_waiter
        return self.take_early()

    def pause(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None:
            self.transport.resume_reading()

    def abort(self) -> None:
        self._keep_alive = False
        if self.transport is not None:
            self.transport.abort()

    def release(self) -> None:
        """Done with this exchange: pool the connection if its response ended cleanly."""
        if self.complete and self._keep_alive and self.transport is not None:
            self._reset()
            self.reused = True
            self.pool.put(self)
        else:
            self.abort()


def _parse_head(raw: bytes) -> Head:
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise ValueError(f"bad status line {lines[0][:80]!r}")
    head = Head(int(parts[1]))
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"bad header line {line[:80]!r}")
        head.headers.append((name.strip(), value.strip()))
    if parts[0] == "HTTP/1.0" and (head.get("Connection") or "").lower() != "keep-alive":
        head.headers.append(("Connection", "close"))
    return head


class UpstreamPool:
    """Idle keep-alive connections per engine address."""

    def __init__(self, *, connect_timeout_s: float, max_idle_per_host: int = 256) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.max_idle_per_host = max_idle_per_host
        self._idle: dict[tuple[str, int], list[Exchange]] = {}

    async def open(self, host: str, port: int, request: bytes, *, tls: bool = False) -> Exchange:
        """An exchange with ``request`` sent: a pooled connection, else a new one."""
        conn = self.reuse(host, port, request)
        if conn is not None:
            return conn
        key = (host, port)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: Exchange(self, key), host, port, ssl=True if tls else None
                )
        except TimeoutError:
            raise UpstreamError("connect", f"connect to {host}:{port} timed out") from None
        except OSError as exc:
            raise UpstreamError("connect", f"{type(exc).__name__}: {exc}") from None
        conn.send(request)
        return conn

    def reuse(self, host: str, port: int, request: bytes) -> Exchange | None:
        """A pooled connection with ``request`` sent, or None when none is idle."""
        idle = self._idle.get((host, port))
        while idle:
            conn = idle.pop()
            if conn.transport is not None and not conn.transport.is_closing():
                conn.send(request)
                return conn
        return None

    def put(self, conn: Exchange) -> None:
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) >= self.max_idle_per_host:
            conn.abort()
            return
        idle.append(conn)

    def forget(self, conn: Exchange) -> None:
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.abort()
        self._idle.clear()
