"""OpenAI-compatible HTTP server around one ``EngineCore`` (aiohttp).

Simulated time runs ``time_scale`` times faster than wall time. A driver task sleeps
until the next step boundary (but at least ``min_tick`` of wall time, so high time
scales batch several steps per wake-up), advances the core and hands each request its
events.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from kvgate.engine.core import EngineCore
from kvgate.engine.http_errors import error_response
from kvgate.engine.metrics import EngineMetrics
from kvgate.engine.outputs import OutputPlan, plan_output
from kvgate.engine.profiles import Profile
from kvgate.engine.request import EngineEvent, EngineRequest, EventKind
from kvgate.engine.responses import ResponsesApi
from kvgate.engine.surface import Surface
from kvgate.kv_events.publisher import KvEventPublisher
from kvgate.kv_events.tokenizer import PromptHasher
from kvgate.kv_events.wire import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from kvgate.prompts import PromptError, completion_prompt, render_chat
from kvgate.tasks import cancel_and_wait
from kvgate.tokens import block_hashes, tokenize

log = logging.getLogger(__name__)


class RequestError(Exception):
    def __init__(self, message: str, param: str | None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.code = code


@dataclass(slots=True)
class _Pending:
    """A submitted request: events arrive in ``queue``; ``arrival`` in simulated time."""

    plan: OutputPlan
    arrival: float
    prompt_tokens: int
    queue: asyncio.Queue[EngineEvent] = field(default_factory=asyncio.Queue)
    cached_tokens: int = 0
    first_token_time: float | None = None


def _int_field(body: dict[str, Any], name: str, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{name} must be an integer", name)
    if value < minimum:
        raise RequestError(f"{name} must be >= {minimum}, got {value}", name)
    return value


def _bool_field(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise RequestError(f"{name} must be a boolean", name)
    return value


def _stop_field(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return list(stop)
    raise RequestError("stop must be a string or a list of strings", "stop")


# The W3C trace context the engine was sent, echoed on a non-streamed answer (tests see
# what a gateway propagated; a real vLLM would start its own span under it).
TRACEPARENT_ECHO = "X-Engine-Traceparent"


@web.middleware
async def _echo_traceparent(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    response = await handler(request)
    sent = request.headers.get("traceparent")
    if sent is not None and not response.prepared:
        response.headers[TRACEPARENT_ECHO] = sent
    return response


@web.middleware
async def _json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Unexpected failures still answer with an OpenAI-style body."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status >= 400:
            return error_response(exc.status, exc.reason, None, None)
        raise
    except Exception:
        log.exception("engine-sim request failed")
        return error_response(500, "internal error in the simulated engine", None, "engine_failed")


class EngineServer:
    def __init__(
        self,
        profile: Profile,
        *,
        model_name: str | None = None,
        engine_index: int = 0,
        time_scale: float = 1.0,
        kv_blocks: int | None = None,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        max_model_len: int | None = None,
        registry: CollectorRegistry | None = None,
        min_tick: float = 0.002,
        wall_clock: Callable[[], float] = time.monotonic,
        kv_events: KvEventPublisher | None = None,
        prompt_hasher: PromptHasher | None = None,
    ) -> None:
        """``kv_events``: publish the cache's KV events (vLLM's wire format) there.
        ``prompt_hasher``: key the cache by the model tokenizer's token ids, hashed as vLLM
        does (else kvgate's text model)."""
        if time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        self.core = EngineCore(
            profile,
            kv_blocks=kv_blocks,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
        )
        self.profile = self.core.profile
        self.publisher = kv_events
        self.prompt_hasher = prompt_hasher
        if prompt_hasher is not None and prompt_hasher.block_size != self.profile.block_size:
            raise ValueError("the prompt hasher's block size must be the profile's")
        if kv_events is not None:
            self.core.scheduler.kv.enable_events()
        self.model_name = model_name or profile.model
        self.time_scale = time_scale
        self.min_tick = min_tick
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = EngineMetrics(
            self.registry,
            model_name=self.model_name,
            engine=str(engine_index),
            block_size=self.profile.block_size,
            num_gpu_blocks=self.profile.num_gpu_blocks,
        )
        self._wall = wall_clock
        self._t0 = wall_clock()
        self._pending: dict[str, _Pending] = {}
        self._wake: asyncio.Event | None = None
        self._driver: asyncio.Task[None] | None = None
        self._failed: tuple[int, str] | None = None
        self.created = int(time.time())
        self.surface = Surface(self)
        self.responses = ResponsesApi(self)

    # ---- time and driver ------------------------------------------------------------

    def sim_now(self) -> float:
        return (self._wall() - self._t0) * self.time_scale

    async def start(self) -> None:
        if self.publisher is not None:
            await self.publisher.start()
        self._wake = asyncio.Event()
        self._driver = asyncio.create_task(self._drive())

    async def stop(self) -> None:
        await cancel_and_wait(self._driver)
        self._driver = None
        if self.publisher is not None:
            await self.publisher.stop()

    def publish_cache_events(self) -> None:
        """Send the KV cache events recorded since the last call as one batch."""
        if self.publisher is None:
            return
        raw = self.core.scheduler.kv.pool.drain_events()
        if not raw:
            return
        bs = self.profile.block_size
        events: list[KVEvent] = []
        for kind, parent, hashes, token_ids in raw:
            if kind == "stored":
                events.append(BlockStored(hashes, parent, list(token_ids), bs, None, "GPU"))
            elif kind == "removed":
                events.append(BlockRemoved(hashes, "GPU"))
            else:
                events.append(AllBlocksCleared())
        self.publisher.publish(events)

    def fail_pending(self, status: int, message: str) -> None:
        """Answer every in-flight and later request with an error (driver failure,
        shutdown)."""
        self._failed = (status, message)
        now = self.sim_now()
        for rid, p in self._pending.items():
            p.queue.put_nowait(EngineEvent(EventKind.FAILED, rid, now))

    def _dispatch(self, events: list[EngineEvent]) -> None:
        self.publish_cache_events()
        for ev in events:
            p = self._pending.get(ev.request_id)
            if p is not None:
                p.queue.put_nowait(ev)

    async def _drive(self) -> None:
        assert self._wake is not None
        wake = self._wake
        loop = asyncio.get_running_loop()
        while True:
            try:
                self._dispatch(self.core.advance_to(self.sim_now()))
            except Exception:
                log.exception("engine driver failed; failing in-flight requests")
                self.fail_pending(500, "engine failed")
                return
            wake.clear()
            next_t = self.core.next_step_time()
            if next_t is None:
                await wake.wait()
                continue
            delay = max((next_t - self.sim_now()) / self.time_scale, self.min_tick)
            timer = loop.call_later(delay, wake.set)
            try:
                await wake.wait()
            finally:
                timer.cancel()

    def submit(self, request_id: str, text_pieces: list[str], plan: OutputPlan) -> _Pending:
        now = self.sim_now()
        if self.prompt_hasher is not None:
            ids = self.prompt_hasher.token_ids("".join(text_pieces))
            hashes = self.prompt_hasher.hasher.hashes(ids)
            req = EngineRequest(request_id, len(ids), hashes, plan.num_tokens, ids)
        else:
            hashes = block_hashes(text_pieces, self.profile.block_size)
            req = EngineRequest(request_id, len(text_pieces), hashes, plan.num_tokens)
        self.core.add_request(req, now)  # raises ValueError before anything is recorded
        pending = _Pending(plan=plan, arrival=now, prompt_tokens=req.prompt_tokens)
        self._pending[request_id] = pending
        self.publish_cache_events()
        if self._wake is not None:
            self._wake.set()
        return pending

    def release(self, request_id: str, *, abort: bool) -> None:
        self._pending.pop(request_id, None)
        if abort:
            self.core.abort(request_id, self.sim_now())
            self.publish_cache_events()

    # ---- HTTP -----------------------------------------------------------------------

    def make_app(self) -> web.Application:
        app = web.Application(
            client_max_size=64 * 1024 * 1024, middlewares=[_echo_traceparent, _json_errors]
        )
        app.router.add_get("/health", self.handle_health)
        app.router.add_get("/v1/models", self.handle_models)
        app.router.add_get("/metrics", self.handle_metrics)
        app.router.add_post("/reset_prefix_cache", self.handle_reset)
        app.router.add_post("/v1/completions", self.handle_completions)
        app.router.add_post("/v1/chat/completions", self.handle_chat)
        self.surface.add_routes(app)
        app.router.add_post("/v1/responses", self.surface.wrap(self.responses.create))
        app.router.add_get("/v1/responses/{response_id}", self.surface.wrap(self.responses.get))
        conversations = self.responses.create_conversation
        app.router.add_post("/v1/conversations", self.surface.wrap(conversations))
        app.router.add_get(
            "/v1/conversations/{conversation_id}",
            self.surface.wrap(self.responses.get_conversation),
        )
        app.on_startup.append(lambda _app: self.start())
        app.on_cleanup.append(lambda _app: self.stop())
        return app

    async def handle_health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def handle_models(self, request: web.Request) -> web.Response:
        model = {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "kvgate-engine-sim",
            "root": self.model_name,
            "max_model_len": self.profile.max_model_len,
        }
        return web.json_response({"object": "list", "data": [model]})

    async def handle_metrics(self, request: web.Request) -> web.Response:
        self._dispatch(self.core.advance_to(self.sim_now()))
        self.metrics.refresh(self.core.stats())
        return web.Response(
            body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def handle_reset(self, request: web.Request) -> web.Response:
        self.core.reset_prefix_cache()
        self.publish_cache_events()
        return web.Response(status=200)

    async def handle_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, chat=False)

    async def handle_chat(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, chat=True)

    async def _read_body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = json.loads(await request.read())
        except (ValueError, UnicodeDecodeError):
            raise RequestError("request body is not valid JSON", None) from None
        if not isinstance(body, dict):
            raise RequestError("request body must be a JSON object", None)
        return body

    async def _handle(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        try:
            body = await self._read_body(request)
            parsed = self._parse(body, chat=chat)
        except RequestError as exc:
            return error_response(exc.status, exc.message, exc.param, exc.code)
        request_id, pieces, plan, stream, include_usage = parsed
        if self._failed:
            return error_response(*self._failed, None, "engine_failed")
        try:
            pending = self.submit(request_id, pieces, plan)
        except ValueError as exc:  # e.g. the tokenizer's count exceeds max_model_len
            return error_response(400, str(exc), "messages" if chat else "prompt")
        finished = False
        try:
            if stream:
                resp = await self._stream(
                    request, request_id, pending, chat=chat, include_usage=include_usage
                )
            else:
                resp = await self._complete(request_id, pending, chat=chat)
            finished = True
            return resp
        finally:
            self.release(request_id, abort=not finished)

    def _parse(
        self, body: dict[str, Any], *, chat: bool
    ) -> tuple[str, list[str], OutputPlan, bool, bool]:
        model = body.get("model")
        if model is not None and model != self.model_name:
            raise RequestError(
                f"The model `{model}` does not exist.", "model", 404, "model_not_found"
            )
        prompt_param = "messages" if chat else "prompt"
        try:
            if chat:
                if "messages" not in body:
                    raise PromptError("messages is required")
                text = render_chat(body["messages"], body.get("tools"))
            else:
                if "prompt" not in body:
                    raise PromptError("prompt is required")
                text = completion_prompt(body["prompt"])
        except PromptError as exc:
            raise RequestError(str(exc), prompt_param) from None
        n = _int_field(body, "n", 1)
        if n not in (None, 1):
            raise RequestError("n: only n=1 is supported", "n")
        max_tokens = _int_field(body, "max_tokens", 1)
        if chat and body.get("max_completion_tokens") is not None:
            max_tokens = _int_field(body, "max_completion_tokens", 1)
        min_tokens = _int_field(body, "min_tokens", 0) or 0
        ignore_eos = _bool_field(body, "ignore_eos")
        stream = _bool_field(body, "stream")
        stop = _stop_field(body)
        options = body.get("stream_options")
        include_usage = False
        if options is not None:
            if not isinstance(options, dict):
                raise RequestError("stream_options must be an object", "stream_options")
            include_usage = bool(options.get("include_usage", False))
        pieces = tokenize(text)
        limit = self.profile.max_model_len
        if max_tokens is None:
            if len(pieces) >= limit:
                raise RequestError(
                    f"This model's maximum context length is {limit} tokens. However, your "
                    f"request has {len(pieces)} input tokens. Please reduce the length of "
                    f"the input.",
                    prompt_param,
                    code="context_length_exceeded",
                )
            max_tokens = limit - len(pieces)
        elif len(pieces) + max_tokens > limit:
            raise RequestError(
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {len(pieces) + max_tokens} tokens ({len(pieces)} in the "
                f"{prompt_param}, {max_tokens} in the completion). Please reduce the length "
                f"of the {prompt_param} or completion.",
                prompt_param,
                code="context_length_exceeded",
            )
        if min_tokens > max_tokens:
            raise RequestError(
                f"min_tokens ({min_tokens}) must be <= max_tokens ({max_tokens})", "min_tokens"
            )
        plan = plan_output(
            text, max_tokens=max_tokens, min_tokens=min_tokens, ignore_eos=ignore_eos, stop=stop
        )
        if plan.num_tokens == 0:
            plan = OutputPlan(plan.pieces[:1] or [" "], "", "stop")
        prefix = "chatcmpl-" if chat else "cmpl-"
        return prefix + uuid.uuid4().hex, pieces, plan, stream, include_usage

    def _usage(self, pending: _Pending) -> dict[str, Any]:
        prompt_tokens, completion_tokens = pending.prompt_tokens, pending.plan.num_tokens
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": pending.cached_tokens},
        }

    def _on_event(self, pending: _Pending, ev: EngineEvent) -> None:
        if ev.kind is EventKind.FIRST_TOKEN:
            pending.cached_tokens = ev.cached_tokens
            pending.first_token_time = ev.time
        elif ev.kind is EventKind.FINISHED:
            ttft = (pending.first_token_time or ev.time) - pending.arrival
            self.metrics.observe_finished(
                ttft=ttft,
                e2e=ev.time - pending.arrival,
                output_tokens=ev.count,
                finish_reason=pending.plan.finish_reason,
            )

    async def _complete(self, request_id: str, pending: _Pending, *, chat: bool) -> web.Response:
        while True:
            ev = await pending.queue.get()
            if ev.kind is EventKind.FAILED:
                status, message = self._failed or (500, "engine failed")
                return error_response(status, message, None, "engine_failed")
            self._on_event(pending, ev)
            if ev.kind is EventKind.FINISHED:
                break
        plan = pending.plan
        usage = self._usage(pending)
        choice: dict[str, Any]
        if chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": plan.text},
                "logprobs": None,
                "finish_reason": plan.finish_reason,
            }
            obj = "chat.completion"
        else:
            choice = {
                "index": 0,
                "text": plan.text,
                "logprobs": None,
                "finish_reason": plan.finish_reason,
            }
            obj = "text_completion"
        body = {
            "id": request_id,
            "object": obj,
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice],
            "usage": usage,
        }
        return web.json_response(body)

    async def _stream(
        self,
        request: web.Request,
        request_id: str,
        pending: _Pending,
        *,
        chat: bool,
        include_usage: bool,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        model = self.model_name
        plan = pending.plan
        pieces = plan.pieces
        text_len = len(plan.text)
        sent_tokens = 0
        sent_chars = 0

        def chunk(text: str, finish: str | None, first: bool = False) -> bytes:
            choice: dict[str, Any]
            if chat:
                delta: dict[str, Any] = {"content": text}
                if first:
                    delta = {"role": "assistant", "content": text}
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            data = {"id": request_id, "object": obj, "created": created, "model": model,
                    "choices": [choice]}  # fmt: skip
            if include_usage:
                data["usage"] = None
            return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"

        while True:
            ev = await pending.queue.get()
            if ev.kind is EventKind.FAILED:
                message = self._failed[1] if self._failed else "engine failed"
                err = {"error": {"message": message, "type": "server_error",
                                 "param": None, "code": "engine_failed"}}  # fmt: skip
                await resp.write(b"data: " + json.dumps(err).encode() + b"\n\ndata: [DONE]\n\n")
                break
            self._on_event(pending, ev)
            if ev.kind not in (EventKind.FIRST_TOKEN, EventKind.TOKENS, EventKind.FINISHED):
                continue
            out: list[bytes] = []
            if ev.kind is not EventKind.FINISHED:
                upto = min(sent_tokens + ev.count, len(pieces))
                for i in range(sent_tokens, upto):
                    # The returned text may be shorter than the pieces (stop string cut).
                    piece = pieces[i][: max(0, text_len - sent_chars)]
                    sent_chars += len(pieces[i])
                    last = i == len(pieces) - 1
                    out.append(chunk(piece, plan.finish_reason if last else None, first=i == 0))
                sent_tokens = upto
            else:
                if include_usage:
                    usage = self._usage(pending)
                    data = {"id": request_id, "object": obj, "created": created, "model": model,
                            "choices": [], "usage": usage}  # fmt: skip
                    out.append(
                        b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"
                    )
                out.append(b"data: [DONE]\n\n")
            if out:
                await resp.write(b"".join(out))
            if ev.kind is EventKind.FINISHED:
                break
        await resp.write_eof()
        return resp
