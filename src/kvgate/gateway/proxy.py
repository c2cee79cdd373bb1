"""Upstream dispatch: route, send, stream back chunk by chunk, retry before the first byte.

Retry rule: a connection error or a 5xx answer before any byte reached the client is
retried on the router's next candidate (``exclude=`` the nodes already tried), at most
``routing.max_retries`` times; once streaming to the client has started nothing is
retried and an engine failure becomes an SSE error event followed by ``[DONE]``.
``router.on_complete`` is called exactly once for every dispatch.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from kvgate.flags import Flags
from kvgate.gateway.bytepath import SseRelay, strip_null_usage
from kvgate.gateway.errors import ApiError, sse_error_event
from kvgate.gateway.metrics import GatewayMetrics
from kvgate.gateway.upstream import Exchange, Head, UpstreamError, UpstreamPool
from kvgate.gateway.usage import (
    Usage,
    client_wants_usage,
    parse_usage,
    with_usage_requested,
)
from kvgate.types import NoNodeAvailable, RouteDecision, RouteRequest

if TYPE_CHECKING:
    from kvgate.routing.router import Router

log = logging.getLogger("kvgate.gateway")

ProgressCallback = Callable[[int], Awaitable[None]]

# Hop-by-hop and gateway-owned headers are never copied from the engine's answer.
_SKIP_UPSTREAM_HEADERS = frozenset(
    h.lower()
    for h in (
        "Content-Length",
        "Transfer-Encoding",
        "Connection",
        "Keep-Alive",
        "Content-Encoding",
        "Date",
        "Server",
        "Content-Type",
    )
)


class UpstreamFailure(Exception):
    """A dispatch failed before anything reached the client (so it may be retried)."""

    def __init__(self, kind: str, message: str, *, status: int = 502) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status


@dataclass(slots=True)
class Call:
    """One client request on its way upstream."""

    request_id: str
    path: str  # e.g. /v1/chat/completions
    endpoint: str  # "chat" | "completions"
    body: dict[str, Any]
    route: RouteRequest
    started: float  # time.perf_counter() at arrival
    headers: dict[str, str] = field(default_factory=dict)  # extra response headers
    on_progress: ProgressCallback | None = None
    raw_body: bytes | None = None  # the client's bytes, forwarded as-is when body is unchanged
    # filled in as the call proceeds, for logs and metrics
    decision: RouteDecision | None = None
    attempts: int = 0
    usage: Usage | None = None

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))


@dataclass(slots=True)
class _Outcome:
    ok: bool = False
    cached_tokens: int | None = None
    output_tokens: int = 0


class Proxy:
    def __init__(
        self,
        *,
        session: aiohttp.ClientSession,
        router: Router,
        node_url: Callable[[str], str | None],
        flags: Flags,
        metrics: GatewayMetrics,
        max_retries: int,
        upstream_timeout_s: float,
        progress_batch_tokens: int = 16,
    ) -> None:
        self.session = session
        self.router = router
        self.node_url = node_url
        self.flags = flags
        self.metrics = metrics
        self.max_retries = max_retries
        self.upstream_timeout_s = upstream_timeout_s
        self.progress_batch_tokens = progress_batch_tokens
        # the byte path below aiohttp's client; the session keeps serving scrapes
        self.pool = UpstreamPool(connect_timeout_s=session.timeout.sock_connect or 3.0)

    async def forward(self, call: Call, request: web.Request | None) -> web.StreamResponse:
        """Dispatch with retries; ``request`` is None for background (async job) calls."""
        tried: list[str] = []
        last_failure: UpstreamFailure | None = None
        attempts = 1 + (self.max_retries if self.flags.enabled("retries") else 0)
        for attempt in range(attempts):
            try:
                decision = self.router.route(call.route, exclude=tuple(tried))
            except NoNodeAvailable as exc:
                if last_failure is not None:
                    break
                raise ApiError(
                    503,
                    f"no node can take the request: {exc}",
                    code="no_node_available",
                    headers={"Retry-After": "1"},
                ) from None
            tried.append(decision.node_id)
            call.decision = decision
            call.attempts = attempt + 1
            if attempt:
                self.metrics.retries.labels(last_failure.kind if last_failure else "?").inc()
            try:
                return await self._dispatch(call, decision, request)
            except UpstreamFailure as failure:
                last_failure = failure
                self.metrics.upstream_errors.labels(decision.node_id, failure.kind).inc()
                log.warning(
                    "upstream failure request_id=%s node=%s kind=%s attempt=%d: %s",
                    call.request_id,
                    decision.node_id,
                    failure.kind,
                    attempt + 1,
                    failure,
                )
        assert last_failure is not None
        raise ApiError(
            502,
            f"upstream failed after {len(tried)} attempt(s): {last_failure}",
            code=f"upstream_{last_failure.kind}",
        )

    async def _dispatch(
        self, call: Call, decision: RouteDecision, request: web.Request | None
    ) -> web.StreamResponse:
        outcome = _Outcome()
        self.router.on_dispatch(call.route, decision)
        self.metrics.child(self.metrics.dispatches, decision.node_id, decision.reason).inc()
        try:
            base = self.node_url(decision.node_id)
            if base is None:
                raise UpstreamFailure("node_removed", f"node {decision.node_id} was removed")
            if call.stream and request is not None:
                return await self._stream(call, decision, base, request, outcome)
            return await self._unary(call, decision, base, outcome)
        finally:
            self._record_usage(decision, call.usage)
            self.router.on_complete(
                call.route,
                decision,
                ok=outcome.ok,
                actual_cached_tokens=outcome.cached_tokens,
                output_tokens=outcome.output_tokens,
            )

    def _record_usage(self, decision: RouteDecision, usage: Usage | None) -> None:
        if usage is None:
            return
        node = decision.node_id
        # predicted vs. actual cached tokens are counted by the router (hit feedback)
        if usage.prompt_tokens is not None:
            self.metrics.child(self.metrics.prompt_tokens, node).inc(usage.prompt_tokens)
        if usage.completion_tokens is not None:
            self.metrics.child(self.metrics.completion_tokens, node).inc(usage.completion_tokens)

    def response_headers(self, call: Call, decision: RouteDecision) -> dict[str, str]:
        return {
            "X-Request-Id": call.request_id,
            "X-KVGate-Node": decision.node_id,
            "X-KVGate-Route-Reason": decision.reason,
            "X-KVGate-Expected-Cached-Tokens": str(decision.expected_cached_tokens),
            **call.headers,
        }

    async def _post(
        self, base: str, call: Call, data: bytes, deadline: float
    ) -> tuple[Exchange, Head]:
        """Send the request; the exchange and the response head, or ``UpstreamFailure``."""
        host, port, prefix, tls = _address(base)
        request = _request_bytes(host, port, prefix + call.path, call.request_id, data)
        for fresh in (False, True):
            exchange: Exchange | None = None
            try:
                async with asyncio.timeout_at(deadline):
                    exchange = await self.pool.open(host, port, request, tls=tls)
                    return exchange, await exchange.head()
            except UpstreamError as exc:
                if exchange is not None:
                    exchange.abort()
                # a pooled keep-alive connection the engine had already closed: once more
                if not fresh and exc.before_response and exchange is not None and exchange.reused:
                    continue
                raise UpstreamFailure(exc.kind, str(exc)) from None
            except TimeoutError:
                if exchange is not None:
                    exchange.abort()
                raise UpstreamFailure("timeout", "upstream timed out", status=504) from None
        raise AssertionError("unreachable")

    def _deadline(self) -> float:
        return asyncio.get_running_loop().time() + self.upstream_timeout_s

    async def _unary(
        self, call: Call, decision: RouteDecision, base: str, outcome: _Outcome
    ) -> web.Response:
        deadline = self._deadline()
        exchange, head = await self._post(base, call, _body_bytes(call, False), deadline)
        try:
            payload = await self._read(exchange, deadline)
        finally:
            exchange.release()
        if head.status >= 500:
            raise UpstreamFailure("http_5xx", f"node answered HTTP {head.status}")
        if head.content_type == "application/json":
            try:
                parsed = json.loads(payload)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                call.usage = parse_usage(parsed)
        outcome.ok = head.status < 400
        if call.usage is not None:
            outcome.cached_tokens = call.usage.cached_tokens
            outcome.output_tokens = call.usage.completion_tokens or 0
        self.metrics.child(self.metrics.ttft, call.endpoint).observe(
            time.perf_counter() - call.started
        )
        return self._answer(call, decision, head, payload)

    @staticmethod
    async def _read(exchange: Exchange, deadline: float) -> bytes:
        try:
            async with asyncio.timeout_at(deadline):
                return await exchange.read()
        except UpstreamError as exc:
            raise UpstreamFailure("read", str(exc)) from None
        except TimeoutError:
            exchange.abort()
            raise UpstreamFailure("timeout", "upstream timed out", status=504) from None

    def _answer(
        self, call: Call, decision: RouteDecision, head: Head, payload: bytes
    ) -> web.Response:
        """The engine's non-streamed answer, with its headers and kvgate's."""
        headers = _passthrough_headers(head)
        headers.update(self.response_headers(call, decision))
        return web.Response(
            status=head.status,
            body=payload,
            headers=headers,
            content_type=head.content_type or "application/json",
        )

    async def _stream(
        self,
        call: Call,
        decision: RouteDecision,
        base: str,
        request: web.Request,
        outcome: _Outcome,
    ) -> web.StreamResponse:
        inject = not client_wants_usage(call.body)
        deadline = self._deadline()
        exchange, head = await self._post(base, call, _body_bytes(call, inject), deadline)
        try:
            if head.status >= 500:
                raise UpstreamFailure("http_5xx", f"node answered HTTP {head.status}")
            if head.status != 200 or head.content_type != "text/event-stream":
                payload = await self._read(exchange, deadline)
                outcome.ok = head.status < 400
                return self._answer(call, decision, head, payload)
            if inject:
                self.metrics.usage_injected.inc()
            return await self._relay_events(
                call, decision, exchange, request, outcome, inject, deadline
            )
        finally:
            exchange.release()

    async def _open_client(
        self, call: Call, decision: RouteDecision, request: web.Request, first: bytes
    ) -> web.StreamResponse:
        headers = self.response_headers(call, decision)
        headers["Cache-Control"] = "no-cache"
        client = web.StreamResponse(status=200, headers=headers)
        client.content_type = "text/event-stream"
        await client.prepare(request)
        self.metrics.child(self.metrics.ttft, call.endpoint).observe(
            time.perf_counter() - call.started
        )
        await client.write(first)  # the head and the first events leave together
        return client

    async def _relay_events(
        self,
        call: Call,
        decision: RouteDecision,
        exchange: Exchange,
        request: web.Request,
        outcome: _Outcome,
        strip_usage: bool,
        deadline: float,
    ) -> web.StreamResponse:
        reporter = _ProgressReporter(self, call, decision) if call.on_progress else None
        relay = SseRelay(
            exchange,
            strip_usage=strip_usage,
            on_progress=reporter.report if reporter else None,
            progress_batch=self.progress_batch_tokens,
        )
        exchange.attach(relay.feed)
        relay.wake_on_end()
        client: web.StreamResponse | None = None
        try:
            async with asyncio.timeout_at(deadline):
                await relay.ready
                first = relay.take_held()
                if first:
                    client = await self._open_client(call, decision, request, first)
                    transport = request.transport
                    if transport is None:
                        raise ConnectionResetError("client went away")
                    chunked = client.headers.get("Transfer-Encoding", "").lower() == "chunked"
                    relay.go_live(transport, chunked=chunked)
                await exchange.finished()
            if relay.client_gone:
                raise ConnectionResetError("client went away")
            if not relay.done:
                raise UpstreamError("stream_broken", "stream ended without [DONE]")
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            return await self._client_gone(call, decision, relay, outcome, client, reporter)
        except (UpstreamError, TimeoutError) as exc:
            if relay.client_gone:
                return await self._client_gone(call, decision, relay, outcome, client, reporter)
            exchange.abort()
            kind = "timeout" if isinstance(exc, TimeoutError) else "stream_broken"
            if client is None:
                raise UpstreamFailure(kind, f"{type(exc).__name__}: {exc}") from None
            self.metrics.upstream_errors.labels(decision.node_id, kind).inc()
            log.warning(
                "stream broke request_id=%s node=%s: %s", call.request_id, decision.node_id, exc
            )
            outcome.output_tokens = relay.generated
            if reporter:
                await reporter.flush()
            with _suppress_disconnect():
                await client.write(
                    sse_error_event(f"engine {decision.node_id} failed mid-stream", code=kind)
                )
                await client.write_eof()
            return client
        if reporter:
            await reporter.flush()
        call.usage = relay.usage
        outcome.ok = True
        outcome.output_tokens = relay.generated
        if call.usage is not None:
            outcome.cached_tokens = call.usage.cached_tokens
            if call.usage.completion_tokens is not None:
                outcome.output_tokens = call.usage.completion_tokens
        if client is None:  # an engine that sent nothing but the end: still answer a stream
            client = await self._open_client(call, decision, request, b"")
        with _suppress_disconnect():
            await client.write_eof()
        return client

    async def _client_gone(
        self,
        call: Call,
        decision: RouteDecision,
        relay: SseRelay,
        outcome: _Outcome,
        client: web.StreamResponse | None,
        reporter: _ProgressReporter | None,
    ) -> web.StreamResponse:
        relay.exchange.abort()
        if reporter:
            await reporter.flush()
        call.usage = relay.usage
        self.metrics.client_disconnects.inc()
        log.info("client went away request_id=%s node=%s", call.request_id, decision.node_id)
        outcome.output_tokens = relay.generated
        return client or web.StreamResponse(status=499)

    def close(self) -> None:
        self.pool.close()


class _ProgressReporter:
    """Generated-token progress from the byte path: the router at once, admission batched.

    The relay reports synchronously (inside ``data_received``); admission's update is a
    coroutine, so at most one runs at a time and it always sends the latest count.
    ``flush`` waits for it, so nothing reaches admission after the request is released.
    """

    def __init__(self, proxy: Proxy, call: Call, decision: RouteDecision) -> None:
        self.proxy = proxy
        self.call = call
        self.decision = decision
        self.latest = 0
        self.sent = 0
        self.task: asyncio.Task[None] | None = None

    def report(self, generated: int) -> None:
        self.proxy.router.on_progress(self.call.route, self.decision, generated)
        self.latest = generated
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        assert self.call.on_progress is not None
        while self.sent < self.latest:
            self.sent = self.latest
            await self.call.on_progress(self.sent)

    async def flush(self) -> None:
        if self.task is not None:
            await self.task


class _suppress_disconnect:
    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> bool:
        return exc_type is not None and issubclass(exc_type, ConnectionResetError | RuntimeError)


def _passthrough_headers(head: Head) -> dict[str, str]:
    return {k: v for k, v in head.headers if k.lower() not in _SKIP_UPSTREAM_HEADERS}


@functools.lru_cache(maxsize=1024)
def _address(base: str) -> tuple[str, int, str, bool]:
    """(host, port, path prefix, TLS) of a node's base URL."""
    url = urlsplit(base)
    tls = url.scheme == "https"
    return url.hostname or "127.0.0.1", url.port or (443 if tls else 80), url.path.rstrip("/"), tls


def _request_bytes(host: str, port: int, path: str, request_id: str, body: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nX-Request-Id: {request_id}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode("latin-1") + body


_USAGE_OPTION = b'"stream_options":{"include_usage":true}'


def _body_bytes(call: Call, inject_usage: bool) -> bytes:
    """The bytes sent upstream: the client's own unless a field must change.

    Usage injection splices ``stream_options`` into the client's bytes when the body has
    none (the common case); otherwise the body is re-serialised.
    """
    raw = call.raw_body
    if not inject_usage:
        if raw is not None:
            return raw
        return json.dumps(call.body, ensure_ascii=False).encode()
    if raw is not None and b'"stream_options"' not in raw:
        brace = raw.find(b"{")
        if brace >= 0 and not raw[:brace].strip():
            rest = raw[brace + 1 :]
            sep = b"" if rest.lstrip().startswith(b"}") else b","
            return raw[: brace + 1] + _USAGE_OPTION + sep + rest
    return json.dumps(with_usage_requested(call.body), ensure_ascii=False).encode()


__all__ = ["Call", "Proxy", "UpstreamFailure", "strip_null_usage"]
