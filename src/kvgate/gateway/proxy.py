"""Upstream dispatch: the request pipeline's live driver (real I/O, asyncio).

Every decision is the pipeline's (``kvgate.pipeline``): which node an attempt goes to,
whether a failure is retried (only before any byte reached the client, only retryable
failures, never to a node tried or ejected, within the retry budget), and what the
router, admission and the outlier detector learn from each attempt. This module sends
bytes and reports each attempt's outcome exactly once. The pipeline may be the
in-process ``RequestPipeline`` or, in a proxy worker of ``kvgate serve --workers N``, its
remote stand-in (``kvgate.gateway.remote``); both answer the same calls.

Bytes move below aiohttp's client (``kvgate.gateway.upstream`` + ``bytepath``): the
client's body is forwarded untouched unless a field must change, a streamed answer is
relayed from ``data_received`` straight to the client's transport, one write per
upstream read, with no per-chunk coroutine or JSON work.

Per attempt: connect timeout, first-byte timeout (when it passes the engine's
``/health`` is probed; an engine that does not answer it is hung: the attempt fails and
is retried elsewhere, while a busy but alive engine is waited for), and an inter-chunk
idle timeout. An engine's answer about the request itself (4xx, a 500) is returned as
the engine said it; 502/503/504 and 429 (overload) are retryable failures.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from kvgate.gateway.bytepath import SseRelay, strip_null_usage
from kvgate.gateway.config import GatewayConfig
from kvgate.gateway.errors import ApiError, sse_error_event
from kvgate.gateway.metrics import GatewayMetrics
from kvgate.gateway.upstream import Exchange, Head, UpstreamError, UpstreamPool
from kvgate.gateway.usage import Usage, client_wants_usage, parse_usage, with_usage_requested
from kvgate.pipeline import AttemptOutcome, Failure, Flow, GiveUp, retryable_status
from kvgate.types import RouteDecision, RouteRequest

log = logging.getLogger("kvgate.gateway")


class Decisions(Protocol):
    """What the proxy asks of the request pipeline (``RequestPipeline`` or its remote)."""

    # a decision at once, or (a remote retry) an awaitable of one; GiveUp when none
    def next_attempt(self, flow: Flow) -> RouteDecision | Awaitable[RouteDecision]: ...

    def attempt_failed(self, flow: Flow, decision: RouteDecision, failure: Failure) -> object: ...

    def attempt_done(
        self, flow: Flow, decision: RouteDecision, outcome: AttemptOutcome
    ) -> None: ...

    async def progress(self, flow: Flow, generated_tokens: int) -> None: ...

    def progress_nowait(
        self, flow: Flow, generated_tokens: int
    ) -> Coroutine[Any, Any, None] | None: ...

    def cancelled(self, stage: str) -> None: ...


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


# An engine that cannot take work now answers these; they are retried, not relayed.
OVERLOAD_STATUS = 429


def _failure_status(status: int) -> str | None:
    """The failure kind of an engine's answer that must not be relayed (None: relay it)."""
    if status == OVERLOAD_STATUS:
        return "overloaded"
    return "http_5xx" if retryable_status(status) else None


class AnswerWatch(Protocol):
    """Reads what an engine answered as it passes (the Responses API's response ids)."""

    def events(self, events: bytes) -> None:
        """A run of complete SSE events of a streamed answer, before it is written."""

    def payload(self, body: dict[str, Any]) -> None:
        """A non-streamed successful answer's JSON body."""

    async def finish(self) -> None:
        """Awaited by the handler once the answer has ended."""


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
    flow: Flow  # the request's way through the pipeline
    started: float  # time.perf_counter() at arrival
    headers: dict[str, str] = field(default_factory=dict)  # extra response headers
    raw_body: bytes | None = None  # the client's bytes, forwarded as-is when body is unchanged
    watch: AnswerWatch | None = None  # sees the answer's events or body as they pass
    # a stream may be sent stream_options.include_usage (the Responses API reports its
    # usage in response.completed and takes no such option)
    usage_option: bool = True
    # filled in as the call proceeds, for logs and metrics
    decision: RouteDecision | None = None
    attempts: int = 0
    usage: Usage | None = None

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def route(self) -> RouteRequest:
        return self.flow.route


@dataclass(slots=True)
class _Outcome(AttemptOutcome):
    reported: int = 0  # the generated count the pipeline already has (streams)


class Proxy:
    def __init__(
        self,
        *,
        session: aiohttp.ClientSession,
        pipeline: Decisions,
        node_url: Callable[[str], str | None],
        metrics: GatewayMetrics,
        upstream_timeout_s: float,
        first_byte_timeout_s: float,
        idle_timeout_s: float,
        probe_timeout_s: float = 1.0,
        progress_batch_tokens: int = 16,
    ) -> None:
        self.session = session  # health probes; the byte path has its own pool
        self.pipeline = pipeline
        self.node_url = node_url
        self.metrics = metrics
        self.upstream_timeout_s = upstream_timeout_s
        self.first_byte_timeout_s = first_byte_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.probe_timeout_s = probe_timeout_s
        self.progress_batch_tokens = progress_batch_tokens
        self.pool = UpstreamPool(connect_timeout_s=session.timeout.sock_connect or 3.0)
        # one health check per engine at a time, shared by every attempt waiting on it
        self._health: dict[str, tuple[float, asyncio.Future[bool]]] = {}

    @classmethod
    def configured(
        cls,
        config: GatewayConfig,
        *,
        session: aiohttp.ClientSession,
        pipeline: Decisions,
        node_url: Callable[[str], str | None],
        metrics: GatewayMetrics,
    ) -> Proxy:
        """A proxy with ``config``'s timeouts and progress batching (owner and workers)."""
        server = config.server
        return cls(
            session=session,
            pipeline=pipeline,
            node_url=node_url,
            metrics=metrics,
            upstream_timeout_s=server.upstream_timeout_s,
            first_byte_timeout_s=server.first_byte_timeout_s,
            idle_timeout_s=server.idle_timeout_s,
            probe_timeout_s=config.pipeline.outlier.probe_timeout_s,
            progress_batch_tokens=server.progress_batch_tokens,
        )

    async def forward(self, call: Call, request: web.Request | None) -> web.StreamResponse:
        """Dispatch with retries; ``request`` is None for background (async job) calls."""
        flow = call.flow
        while True:
            try:
                decision = self.pipeline.next_attempt(flow)
                if not isinstance(decision, RouteDecision):
                    decision = await decision
            except GiveUp as stop:
                headers = {}
                if stop.retry_after_s is not None:
                    headers["Retry-After"] = str(max(1, round(stop.retry_after_s)))
                raise ApiError(stop.status, str(stop), code=stop.code, headers=headers) from None
            call.decision = decision
            call.attempts = flow.attempts
            try:
                return await self._dispatch(call, decision, request)
            except UpstreamFailure as failure:
                log.warning(
                    "upstream failure request_id=%s node=%s kind=%s attempt=%d: %s",
                    call.request_id,
                    decision.node_id,
                    failure.kind,
                    flow.attempts,
                    failure,
                )

    async def _dispatch(
        self, call: Call, decision: RouteDecision, request: web.Request | None
    ) -> web.StreamResponse:
        """One attempt; its outcome goes to the pipeline exactly once."""
        outcome = _Outcome()
        failure: UpstreamFailure | None = None
        try:
            base = self.node_url(decision.node_id)
            if base is None:
                raise UpstreamFailure("node_removed", f"node {decision.node_id} was removed")
            if call.stream and request is not None:
                response = await self._stream(call, decision, base, request, outcome)
            else:
                response = await self._unary(call, decision, base, outcome)
            # the final count (streams report batches; the last batch may already be it)
            if outcome.ok and outcome.output_tokens and outcome.output_tokens != outcome.reported:
                await self.pipeline.progress(call.flow, outcome.output_tokens)
            return response
        except UpstreamFailure as exc:
            failure = exc
            raise
        except asyncio.CancelledError:  # the client left: its upstream request goes too
            self.metrics.client_disconnects.inc()
            self.pipeline.cancelled("upstream")
            log.info("client went away request_id=%s node=%s", call.request_id, decision.node_id)
            raise
        finally:
            self._record_usage(decision, call.usage)
            if failure is not None:
                why = Failure(failure.kind, str(failure), status=failure.status)
                self.pipeline.attempt_failed(call.flow, decision, why)
            else:
                self.pipeline.attempt_done(call.flow, decision, outcome)

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

    # -- sending -------------------------------------------------------------------------
    async def _post(
        self, base: str, call: Call, data: bytes, deadline: float
    ) -> tuple[Exchange, Head]:
        """Send the request and wait for the answer's head (first-byte rule), or fail."""
        host, port, prefix, tls = _address(base)
        request = _request_bytes(
            host, port, prefix + call.path, call.request_id, data, call.flow.upstream_traceparent
        )
        for fresh in (False, True):
            exchange: Exchange | None = None
            try:
                # a pooled connection is sent on at once: the deadline's timer (a
                # Timeout context per request) is for a new connection only
                exchange = self.pool.reuse(host, port, request)
                if exchange is None:
                    async with asyncio.timeout_at(deadline):
                        exchange = await self.pool.open(host, port, request, tls=tls)
                return exchange, await self._head(exchange, base, deadline)
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
            except BaseException:  # a failed probe or a client that left: the request goes
                if exchange is not None:
                    exchange.abort()
                raise
        raise AssertionError("unreachable")

    async def _head(self, exchange: Exchange, base: str, deadline: float) -> Head:
        """The answer's head; TimeoutError at ``deadline``."""
        waiter = exchange.head_future
        loop = waiter.get_loop()  # (asyncio.get_running_loop() costs a getpid syscall)
        while True:
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError
            if await _settled(waiter, min(self.first_byte_timeout_s, left)):
                return waiter.result()
            if loop.time() >= deadline:
                raise TimeoutError
            async with asyncio.timeout_at(deadline):
                alive = await self._alive(base)
            if not alive:
                raise UpstreamFailure(
                    "timeout",
                    f"no first byte within {self.first_byte_timeout_s:g}s and "
                    "the engine does not answer /health",
                    status=504,
                )

    async def _alive(self, base: str) -> bool:
        """Whether the engine still answers its health check (busy is fine, hung is not)."""
        now = time.monotonic()
        shared = self._health.get(base)
        if shared is None or now - shared[0] > self.probe_timeout_s:
            shared = (now, asyncio.ensure_future(self._health_check(base)))
            self._health[base] = shared
        return await asyncio.shield(shared[1])

    async def _health_check(self, base: str) -> bool:
        timeout = aiohttp.ClientTimeout(total=self.probe_timeout_s)
        try:
            async with self.session.get(base + "/health", timeout=timeout) as resp:
                return resp.status < 500
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    def _deadline(self) -> float:
        return asyncio.get_running_loop().time() + self.upstream_timeout_s

    # -- non-streamed --------------------------------------------------------------------
    async def _unary(
        self, call: Call, decision: RouteDecision, base: str, outcome: _Outcome
    ) -> web.Response:
        deadline = self._deadline()
        exchange, head = await self._post(base, call, _body_bytes(call, False), deadline)
        try:
            payload = await self._read(exchange, deadline)
        finally:
            exchange.release()
        kind = _failure_status(head.status)
        if kind is not None:
            raise UpstreamFailure(kind, f"node answered HTTP {head.status}")
        outcome.status = head.status
        if head.content_type == "application/json":
            try:
                parsed = json.loads(payload)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                call.usage = parse_usage(parsed)
                if call.watch is not None and head.status < 400:
                    call.watch.payload(parsed)
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

    # -- streamed ------------------------------------------------------------------------
    async def _stream(
        self,
        call: Call,
        decision: RouteDecision,
        base: str,
        request: web.Request,
        outcome: _Outcome,
    ) -> web.StreamResponse:
        inject = call.usage_option and not client_wants_usage(call.body)
        deadline = self._deadline()
        exchange, head = await self._post(base, call, _body_bytes(call, inject), deadline)
        try:
            kind = _failure_status(head.status)
            if kind is not None:
                raise UpstreamFailure(kind, f"node answered HTTP {head.status}")
            outcome.status = head.status
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
            exchange.release()  # pooled after a clean end, else closed (the engine stops)

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

    def _opener(
        self, call: Call, decision: RouteDecision, request: web.Request
    ) -> Callable[[bytes], tuple[asyncio.Transport, Any] | None] | None:
        """For the lean front: open the client's stream from inside the relay, with the
        first events (its head is written synchronously), instead of waking the proxy."""
        open_stream = getattr(request, "open_stream", None)
        if open_stream is None:
            return None

        def opener(first: bytes) -> tuple[asyncio.Transport, Any] | None:
            transport = request.transport
            if transport is None:
                return None
            headers = self.response_headers(call, decision)
            headers["Cache-Control"] = "no-cache"
            sent = open_stream(headers, first)
            if sent is None:
                return None  # the proxy opens it as for aiohttp's server
            self.metrics.child(self.metrics.ttft, call.endpoint).observe(
                time.perf_counter() - call.started
            )
            return transport, sent

        return opener

    async def _wait_idle(
        self, relay: SseRelay, waiter: asyncio.Future[Any], deadline: float
    ) -> None:
        """Wait for ``waiter`` while bytes keep coming: TimeoutError after an idle gap or
        at the deadline (no per-chunk timer: the relay counts reads, checked per gap)."""
        loop = waiter.get_loop()
        while True:
            seen = relay.reads
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError
            if await _settled(waiter, min(self.idle_timeout_s, left)):
                waiter.result()  # raises the exchange's failure, if any
                return
            if relay.reads == seen:
                raise TimeoutError

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
        reporter = _ProgressReporter(self.pipeline, call.flow)
        relay = SseRelay(
            exchange,
            strip_usage=strip_usage,
            on_progress=reporter.report,
            progress_batch=self.progress_batch_tokens,
            opener=self._opener(call, decision, request),
            on_events=call.watch.events if call.watch is not None else None,
        )
        exchange.attach(relay.feed)
        relay.wake_on_end()
        client: web.StreamResponse | None = None
        try:
            try:
                await self._wait_idle(relay, relay.ready, deadline)
            finally:
                client = relay.opened  # opened by the first events (lean front), or None
            first = relay.take_held()
            if client is None and first:
                client = await self._open_client(call, decision, request, first)
                transport = request.transport
                if transport is None:
                    raise ConnectionResetError("client went away")
                chunked = client.headers.get("Transfer-Encoding", "").lower() == "chunked"
                relay.go_live(transport, chunked=chunked)
            await self._wait_idle(relay, exchange.done_future, deadline)
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
            outcome.broken = kind
            log.warning(
                "stream broke request_id=%s node=%s: %s", call.request_id, decision.node_id, exc
            )
            outcome.output_tokens = relay.generated
            call.usage = relay.usage
            await reporter.flush()
            error = sse_error_event(f"engine {decision.node_id} failed mid-stream", code=kind)
            with _suppress_disconnect():
                await client.write(relay.take_tail() + error)
                await client.write_eof()
            return client
        await reporter.flush()
        outcome.reported = reporter.sent
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
            await client.write_eof(relay.take_tail())  # the last events and the end, one write
        return client

    async def _client_gone(
        self,
        call: Call,
        decision: RouteDecision,
        relay: SseRelay,
        outcome: _Outcome,
        client: web.StreamResponse | None,
        reporter: _ProgressReporter,
    ) -> web.StreamResponse:
        relay.exchange.abort()
        await reporter.flush()
        call.usage = relay.usage
        self.metrics.client_disconnects.inc()
        log.info("client went away request_id=%s node=%s", call.request_id, decision.node_id)
        outcome.output_tokens = relay.generated
        return client or web.StreamResponse(status=499)

    def close(self) -> None:
        self.pool.close()


class _ProgressReporter:
    """Generated-token progress from the byte path to the pipeline, batched.

    The relay reports synchronously (inside ``data_received``) and the pipeline's
    bookkeeping is done there, without a task; only when admission must drain its queue
    (the first token freed a prefill-gate place) does a task finish the update, and
    reports arriving meanwhile wait for it and send the latest count. ``flush`` waits for
    that task (and raises what the bookkeeping raised), so nothing reaches admission
    after the request is released.
    """

    def __init__(self, pipeline: Decisions, flow: Flow) -> None:
        self.pipeline = pipeline
        self.flow = flow
        self.latest = 0
        self.sent = 0
        self.task: asyncio.Task[None] | None = None
        self.error: Exception | None = None

    def report(self, generated: int) -> None:
        self.latest = generated
        if self.error is not None or (self.task is not None and not self.task.done()):
            return
        self.sent = generated
        try:
            pending = self.pipeline.progress_nowait(self.flow, generated)
        except Exception as exc:  # raised by flush, in the handler, as the task's would be
            self.error = exc
            return
        if pending is not None:
            self.task = asyncio.get_running_loop().create_task(self._finish(pending))

    async def _finish(self, pending: Coroutine[Any, Any, None]) -> None:
        await pending
        while self.sent < self.latest:
            self.sent = self.latest
            await self.pipeline.progress(self.flow, self.sent)

    async def flush(self) -> None:
        if self.task is not None:
            await self.task
        if self.error is not None:
            raise self.error


async def _settled(future: asyncio.Future[Any], timeout_s: float) -> bool:
    """Whether ``future`` is done within ``timeout_s`` (it is left running either way).

    ``asyncio.wait`` for one future, without its sets and per-call bookkeeping: one
    wake-up future, one timer, one callback."""
    if future.done():
        return True
    loop = future.get_loop()
    wake: asyncio.Future[None] = loop.create_future()

    def settle(_: object = None) -> None:
        if not wake.done():
            wake.set_result(None)

    timer = loop.call_later(timeout_s, settle)
    future.add_done_callback(settle)
    try:
        await wake
    finally:
        timer.cancel()
        future.remove_done_callback(settle)
    return future.done()


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


def _request_bytes(
    host: str, port: int, path: str, request_id: str, body: bytes, traceparent: str | None = None
) -> bytes:
    trace = f"traceparent: {traceparent}\r\n" if traceparent is not None else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nX-Request-Id: {request_id}\r\n{trace}"
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


__all__ = ["AnswerWatch", "Call", "Decisions", "Proxy", "UpstreamFailure", "strip_null_usage"]
