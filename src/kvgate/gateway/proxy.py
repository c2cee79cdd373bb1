"""Upstream dispatch: the request pipeline's live driver (real I/O, asyncio).

Every decision is the pipeline's (``kvgate.pipeline``): which node an attempt goes to,
whether a failure is retried (only before any byte reached the client, only retryable
failures, never to a node tried or ejected, within the retry budget), and what the
router, admission and the outlier detector learn from each attempt. This module sends
bytes and reports each attempt's outcome exactly once.

Per attempt: connect timeout (session), first-byte timeout (when it passes the engine's
``/health`` is probed; an engine that does not answer it is hung: the attempt fails and
is retried elsewhere, while a busy but alive engine is waited for), and an inter-chunk
idle timeout. An engine's answer about the request itself (4xx, a 500) is returned as
the engine said it; 502/503/504 and 429 (overload) are retryable failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from kvgate.gateway.errors import ApiError, sse_error_event
from kvgate.gateway.metrics import GatewayMetrics
from kvgate.gateway.sse import SseSplitter
from kvgate.gateway.usage import (
    Usage,
    chunk_generated_tokens,
    client_wants_usage,
    is_usage_only_chunk,
    parse_usage,
    with_usage_requested,
)
from kvgate.pipeline import Failure, Flow, GiveUp, retryable_status
from kvgate.types import RouteDecision, RouteRequest

if TYPE_CHECKING:
    from kvgate.pipeline import RequestPipeline

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


# An engine that cannot take work now answers these; they are retried, not relayed.
OVERLOAD_STATUS = 429


def _failure_status(status: int) -> str | None:
    """The failure kind of an engine's answer that must not be relayed (None: relay it)."""
    if status == OVERLOAD_STATUS:
        return "overloaded"
    return "http_5xx" if retryable_status(status) else None


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
    on_progress: ProgressCallback | None = None
    raw_body: bytes | None = None  # the client's bytes, forwarded as-is when body is unchanged
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
class _Outcome:
    ok: bool = False
    cached_tokens: int | None = None
    output_tokens: int = 0
    broken: str | None = None  # the engine failed after the client got bytes


class Proxy:
    def __init__(
        self,
        *,
        session: aiohttp.ClientSession,
        pipeline: RequestPipeline,
        node_url: Callable[[str], str | None],
        metrics: GatewayMetrics,
        upstream_timeout_s: float,
        first_byte_timeout_s: float,
        idle_timeout_s: float,
        probe_timeout_s: float = 1.0,
        progress_batch_tokens: int = 16,
    ) -> None:
        self.session = session
        self.pipeline = pipeline
        self.node_url = node_url
        self.metrics = metrics
        self.upstream_timeout_s = upstream_timeout_s
        self.first_byte_timeout_s = first_byte_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.probe_timeout_s = probe_timeout_s
        self.progress_batch_tokens = progress_batch_tokens
        # one health check per engine at a time, shared by every attempt waiting on it
        self._health: dict[str, tuple[float, asyncio.Future[bool]]] = {}

    async def forward(self, call: Call, request: web.Request | None) -> web.StreamResponse:
        """Dispatch with retries; ``request`` is None for background (async job) calls."""
        flow = call.flow
        call.on_progress = partial(self.pipeline.progress, flow)
        while True:
            try:
                decision = self.pipeline.next_attempt(flow)
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
            if outcome.ok and outcome.output_tokens:  # the final count (streams report batches)
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
                self.pipeline.attempt_done(
                    call.flow,
                    decision,
                    ok=outcome.ok,
                    cached_tokens=outcome.cached_tokens,
                    output_tokens=outcome.output_tokens,
                    broken=outcome.broken,
                )

    def _record_usage(self, decision: RouteDecision, usage: Usage | None) -> None:
        if usage is None:
            return
        node = decision.node_id
        # predicted vs. actual cached tokens are counted by the router (hit feedback)
        if usage.prompt_tokens is not None:
            self.metrics.prompt_tokens.labels(node).inc(usage.prompt_tokens)
        if usage.completion_tokens is not None:
            self.metrics.completion_tokens.labels(node).inc(usage.completion_tokens)

    def response_headers(self, call: Call, decision: RouteDecision) -> dict[str, str]:
        return {
            "X-Request-Id": call.request_id,
            "X-KVGate-Node": decision.node_id,
            "X-KVGate-Route-Reason": decision.reason,
            "X-KVGate-Expected-Cached-Tokens": str(decision.expected_cached_tokens),
            **call.headers,
        }

    async def _post(
        self, base: str, call: Call, body: dict[str, Any] | None
    ) -> aiohttp.ClientResponse:
        if body is None and call.raw_body is not None:
            data = call.raw_body
        else:
            data = json.dumps(body if body is not None else call.body, ensure_ascii=False).encode()
        # the idle timeout also bounds the wait for a stream's headers; a non-streamed
        # answer's headers come when it is done, which the first-byte check governs
        timeout = aiohttp.ClientTimeout(
            total=self.upstream_timeout_s,
            sock_read=self.idle_timeout_s if call.stream else None,
        )
        sending = asyncio.ensure_future(
            self.session.post(
                base + call.path,
                data=data,
                headers={"Content-Type": "application/json", "X-Request-Id": call.request_id},
                timeout=timeout,
            )
        )
        try:
            while True:
                done, _ = await asyncio.wait({sending}, timeout=self.first_byte_timeout_s)
                if done:
                    return sending.result()
                if not await self._alive(base):
                    raise UpstreamFailure(
                        "timeout",
                        f"no first byte within {self.first_byte_timeout_s:g}s and "
                        "the engine does not answer /health",
                        status=504,
                    )
        except aiohttp.ServerDisconnectedError as exc:  # died while working on the request
            raise UpstreamFailure("disconnected", f"{type(exc).__name__}: {exc}") from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise UpstreamFailure("connect", f"{type(exc).__name__}: {exc}") from None
        except TimeoutError:
            raise UpstreamFailure("timeout", "upstream timed out", status=504) from None
        finally:
            if not sending.done():  # a failed attempt or a client that left
                sending.cancel()
                with contextlib.suppress(BaseException):
                    await sending

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

    async def _unary(
        self, call: Call, decision: RouteDecision, base: str, outcome: _Outcome
    ) -> web.Response:
        resp = await self._post(base, call, None)
        try:
            payload = await resp.read()
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise UpstreamFailure("read", f"{type(exc).__name__}: {exc}") from None
        except TimeoutError:
            raise UpstreamFailure("timeout", "upstream timed out", status=504) from None
        finally:
            resp.release()
        kind = _failure_status(resp.status)
        if kind is not None:
            raise UpstreamFailure(kind, f"node answered HTTP {resp.status}")
        if resp.content_type == "application/json":
            try:
                parsed = json.loads(payload)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                call.usage = parse_usage(parsed)
        outcome.ok = resp.status < 400
        if call.usage is not None:
            outcome.cached_tokens = call.usage.cached_tokens
            outcome.output_tokens = call.usage.completion_tokens or 0
        self.metrics.ttft.labels(call.endpoint).observe(time.perf_counter() - call.started)
        return self._answer(call, decision, resp, payload)

    def _answer(
        self, call: Call, decision: RouteDecision, resp: aiohttp.ClientResponse, payload: bytes
    ) -> web.Response:
        """The engine's non-streamed answer, with its headers and kvgate's."""
        headers = _passthrough_headers(resp)
        headers.update(self.response_headers(call, decision))
        return web.Response(
            status=resp.status,
            body=payload,
            headers=headers,
            content_type=resp.content_type or "application/json",
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
        resp = await self._post(base, call, with_usage_requested(call.body) if inject else None)
        try:
            kind = _failure_status(resp.status)
            if kind is not None:
                raise UpstreamFailure(kind, f"node answered HTTP {resp.status}")
            if resp.status != 200 or resp.content_type != "text/event-stream":
                return await self._plain_answer(call, decision, resp, outcome)
            if inject:
                self.metrics.usage_injected.inc()
            return await self._relay_events(call, decision, resp, request, outcome, inject)
        finally:
            resp.close()

    async def _plain_answer(
        self,
        call: Call,
        decision: RouteDecision,
        resp: aiohttp.ClientResponse,
        outcome: _Outcome,
    ) -> web.Response:
        try:
            payload = await resp.read()
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise UpstreamFailure("read", f"{type(exc).__name__}: {exc}") from None
        outcome.ok = resp.status < 400
        return self._answer(call, decision, resp, payload)

    async def _relay_events(
        self,
        call: Call,
        decision: RouteDecision,
        resp: aiohttp.ClientResponse,
        request: web.Request,
        outcome: _Outcome,
        strip_usage: bool,
    ) -> web.StreamResponse:
        client: web.StreamResponse | None = None
        splitter = SseSplitter()
        generated = 0
        reported = 0
        done = False

        async def send(data: bytes) -> None:
            nonlocal client
            if client is None:
                headers = self.response_headers(call, decision)
                headers["Cache-Control"] = "no-cache"
                client = web.StreamResponse(status=200, headers=headers)
                client.content_type = "text/event-stream"
                await client.prepare(request)
                self.metrics.ttft.labels(call.endpoint).observe(time.perf_counter() - call.started)
            await client.write(data)

        try:
            async for chunk in resp.content.iter_any():
                for event in splitter.feed(chunk):
                    if event.is_done:
                        done = True
                        await send(event.raw + b"\n\n")
                        continue
                    data = event.json()
                    if data is not None:
                        usage = parse_usage(data)
                        if usage is not None:
                            call.usage = usage
                        if strip_usage and is_usage_only_chunk(data):
                            continue
                        generated += chunk_generated_tokens(data)
                        if strip_usage and "usage" in data:
                            # the client did not ask for usage: hide the injected null field
                            await send(strip_null_usage(event.raw) + b"\n\n")
                            continue
                    await send(event.raw + b"\n\n")
                if call.on_progress and generated - reported >= self.progress_batch_tokens:
                    reported = generated
                    await call.on_progress(generated)
            if not done:
                raise aiohttp.ClientPayloadError("stream ended without [DONE]")
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            self.metrics.client_disconnects.inc()
            log.info("client went away request_id=%s node=%s", call.request_id, decision.node_id)
            outcome.output_tokens = generated
            return client or web.StreamResponse(status=499)
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
            kind = "timeout" if isinstance(exc, TimeoutError) else "stream_broken"
            if client is None:
                raise UpstreamFailure(kind, f"{type(exc).__name__}: {exc}") from None
            outcome.broken = kind
            log.warning(
                "stream broke request_id=%s node=%s: %s", call.request_id, decision.node_id, exc
            )
            outcome.output_tokens = generated
            with _suppress_disconnect():
                await client.write(
                    sse_error_event(f"engine {decision.node_id} failed mid-stream", code=kind)
                )
            return client
        outcome.ok = True
        outcome.output_tokens = generated
        if call.usage is not None:
            outcome.cached_tokens = call.usage.cached_tokens
            if call.usage.completion_tokens is not None:
                outcome.output_tokens = call.usage.completion_tokens
        if client is None:  # an engine that sent only [DONE]: still answer as a stream
            await send(b"")
        assert client is not None
        with _suppress_disconnect():
            await client.write_eof()
        return client


class _suppress_disconnect:
    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> bool:
        return exc_type is not None and issubclass(exc_type, ConnectionResetError | RuntimeError)


def strip_null_usage(raw: bytes) -> bytes:
    return raw.replace(b',"usage":null', b"").replace(b', "usage": null', b"")


def _passthrough_headers(resp: aiohttp.ClientResponse) -> dict[str, str]:
    return {k: v for k, v in resp.headers.items() if k.lower() not in _SKIP_UPSTREAM_HEADERS}


__all__ = ["Call", "Proxy", "UpstreamFailure"]
