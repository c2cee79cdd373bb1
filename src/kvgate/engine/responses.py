"""Engine-sim's stateful Responses API: ``POST /v1/responses`` (streamed or not) and
``GET /v1/responses/{id}``.

Each stored response keeps its whole conversation (prompt text and output) in this
engine instance only, as vLLM does: a ``previous_response_id`` continues from it here,
and any other instance answers 404 ``response_not_found``. A turn's messages
(``kvgate.routing.responses_input``) are rendered with the chat template, so a first
turn's prompt is the one the gateway hashes for cache affinity. A streamed answer sends
the OpenAI event sequence (``response.created`` … ``response.output_text.delta`` …
``response.completed``, each as ``event:``/``data:`` lines, no ``[DONE]``); the response
is stored before ``response.completed`` is sent, so a client may chain on it at once.

Conversations (``POST /v1/conversations``, ``GET /v1/conversations/{id}``) are kept the
same way: a response made with ``conversation`` reads the conversation's text first and
appends its turn and output to it; an unknown conversation is a 404
``conversation_not_found``, and ``conversation`` with ``previous_response_id`` a 400.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from typing import Any

from aiohttp import web

from kvgate.engine.http_errors import error_response
from kvgate.engine.outputs import OutputPlan, plan_output
from kvgate.engine.request import EventKind
from kvgate.engine.surface import SurfaceError, SurfaceHost
from kvgate.prompts import PromptError, render_chat
from kvgate.routing.responses_input import conversation_id, input_messages, previous_response_id
from kvgate.tokens import tokenize

MAX_STORED_RESPONSES = 10_000
DEFAULT_MAX_OUTPUT_TOKENS = 256


def _conversation_not_found(cid: str) -> SurfaceError:
    return SurfaceError(
        f"Conversation with id '{cid}' not found.", "conversation", 404, "conversation_not_found"
    )


def _not_found(rid: str, param: str) -> SurfaceError:
    return SurfaceError(f"Response with id '{rid}' not found.", param, 404, "response_not_found")


class ResponsesApi:
    """The Responses routes of one ``EngineServer`` and the responses it stores."""

    def __init__(self, server: SurfaceHost) -> None:
        self.server = server
        # response id -> the full conversation text (prompt + output), oldest first
        self.stored: OrderedDict[str, str] = OrderedDict()
        self.objects: dict[str, dict[str, Any]] = {}  # response id -> its response object
        # conversation id -> (its object, its text so far)
        self.conversations: OrderedDict[str, tuple[dict[str, Any], str]] = OrderedDict()

    async def create_conversation(self, request: web.Request, body: dict[str, Any]) -> web.Response:
        items = body.get("items")
        text = ""
        if items is not None:
            try:
                text = render_chat(input_messages({"input": items}))
            except PromptError as exc:
                raise SurfaceError(str(exc).replace("input", "items", 1), "items") from None
        metadata = body.get("metadata")
        cid = "conv_" + uuid.uuid4().hex
        obj: dict[str, Any] = {
            "id": cid,
            "object": "conversation",
            "created_at": int(time.time()),
            "metadata": metadata if isinstance(metadata, dict) else {},
        }
        while len(self.conversations) >= MAX_STORED_RESPONSES:
            self.conversations.popitem(last=False)
        self.conversations[cid] = (obj, text)
        return web.json_response(obj)

    async def get_conversation(self, request: web.Request, body: dict[str, Any]) -> web.Response:
        cid = request.match_info["conversation_id"]
        if cid not in self.conversations:
            raise _conversation_not_found(cid)
        return web.json_response(self.conversations[cid][0])

    async def get(self, request: web.Request, body: dict[str, Any]) -> web.Response:
        rid = request.match_info["response_id"]
        if rid not in self.objects:
            raise _not_found(rid, "response_id")
        return web.json_response(self.objects[rid])

    async def create(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        text, prev, conv = self._conversation(body)
        max_out = body.get("max_output_tokens")
        if max_out is not None and (
            isinstance(max_out, bool) or not isinstance(max_out, int) or max_out < 1
        ):
            raise SurfaceError("max_output_tokens must be a positive integer", "max_output_tokens")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise SurfaceError("stream must be a boolean", "stream")
        store = body.get("store", True) is not False
        pieces = tokenize(text)
        limit = self.server.profile.max_model_len
        if len(pieces) >= limit:
            raise SurfaceError(
                f"This model's maximum context length is {limit} tokens. However, your "
                f"request has {len(pieces)} input tokens.",
                "input",
                code="context_length_exceeded",
            )
        max_tokens = min(max_out or DEFAULT_MAX_OUTPUT_TOKENS, limit - len(pieces))
        plan = plan_output(text, max_tokens=max_tokens, min_tokens=0, ignore_eos=False, stop=[])
        if plan.num_tokens == 0:
            plan = OutputPlan(plan.pieces[:1] or [" "], "", "stop")
        if self.server._failed:
            return error_response(*self.server._failed, None, "engine_failed")
        turn = _Turn("resp_" + uuid.uuid4().hex, "msg_" + uuid.uuid4().hex, prev, body, plan)
        turn.conversation = conv
        pending = self.server.submit(turn.rid, pieces, plan)
        finished = False
        try:
            if stream:
                response: web.StreamResponse = await self._stream(
                    request, turn, pending, text, store
                )
            else:
                response = await self._complete(turn, pending, text, store)
            finished = True
            return response
        finally:
            self.server.release(turn.rid, abort=not finished)

    # -- answers -------------------------------------------------------------------------
    def _object(self, turn: _Turn, status: str, usage: dict[str, Any] | None) -> dict[str, Any]:
        content = []
        if status == "completed":
            content = [{"type": "output_text", "text": turn.plan.text, "annotations": []}]
        return {
            "id": turn.rid,
            "object": "response",
            "created_at": turn.created,
            "model": self.server.model_name,
            "status": status,
            "previous_response_id": turn.prev,
            "conversation": {"id": turn.conversation} if turn.conversation else None,
            "instructions": turn.body.get("instructions"),
            "max_output_tokens": turn.body.get("max_output_tokens"),
            "output": [
                {
                    "type": "message",
                    "id": turn.msg_id,
                    "status": status,
                    "role": "assistant",
                    "content": content,
                }
            ]
            if status == "completed"
            else [],
            "parallel_tool_calls": False,
            "tool_choice": "auto",
            "tools": [],
            "usage": _responses_usage(usage) if usage is not None else None,
        }

    def _store(self, turn: _Turn, text: str, obj: dict[str, Any]) -> None:
        while len(self.stored) >= MAX_STORED_RESPONSES:
            old, _ = self.stored.popitem(last=False)
            self.objects.pop(old, None)
        self.stored[turn.rid] = text + turn.plan.text
        self.objects[turn.rid] = obj
        conv = turn.conversation
        if conv is not None and conv in self.conversations:
            self.conversations[conv] = (self.conversations[conv][0], text + turn.plan.text)

    async def _finished(self, pending: Any) -> bool:
        """Wait for the engine to finish the request; False if the engine failed."""
        while True:
            ev = await pending.queue.get()
            if ev.kind is EventKind.FAILED:
                return False
            self.server._on_event(pending, ev)
            if ev.kind is EventKind.FINISHED:
                return True

    async def _complete(self, turn: _Turn, pending: Any, text: str, store: bool) -> web.Response:
        if not await self._finished(pending):
            status, message = self.server._failed or (500, "engine failed")
            return error_response(status, message, None, "engine_failed")
        obj = self._object(turn, "completed", self.server._usage(pending))
        if store:
            self._store(turn, text, obj)
        return web.json_response(obj)

    async def _stream(
        self, request: web.Request, turn: _Turn, pending: Any, text: str, store: bool
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        events = _Events()
        opening = self._object(turn, "in_progress", None)
        item = {"type": "message", "id": turn.msg_id, "status": "in_progress",
                "role": "assistant", "content": []}  # fmt: skip
        part = {"type": "output_text", "text": "", "annotations": []}
        where = {"item_id": turn.msg_id, "output_index": 0, "content_index": 0}
        await resp.write(
            events.make("response.created", response=opening)
            + events.make("response.in_progress", response=opening)
            + events.make("response.output_item.added", output_index=0, item=item)
            + events.make("response.content_part.added", **where, part=part)
        )
        plan = turn.plan
        pieces, text_len = plan.pieces, len(plan.text)
        sent_tokens = sent_chars = 0
        while True:
            ev = await pending.queue.get()
            if ev.kind is EventKind.FAILED:
                message = self.server._failed[1] if self.server._failed else "engine failed"
                failed = {**opening, "status": "failed",
                          "error": {"code": "server_error", "message": message}}  # fmt: skip
                await resp.write(events.make("response.failed", response=failed))
                break
            self.server._on_event(pending, ev)
            if ev.kind in (EventKind.FIRST_TOKEN, EventKind.TOKENS):
                out = []
                upto = min(sent_tokens + ev.count, len(pieces))
                for i in range(sent_tokens, upto):
                    # the returned text may be shorter than the pieces (stop string cut)
                    piece = pieces[i][: max(0, text_len - sent_chars)]
                    sent_chars += len(pieces[i])
                    if piece:
                        out.append(
                            events.make(
                                "response.output_text.delta", **where, delta=piece, logprobs=[]
                            )
                        )
                sent_tokens = upto
                if out:
                    await resp.write(b"".join(out))
            elif ev.kind is EventKind.FINISHED:
                obj = self._object(turn, "completed", self.server._usage(pending))
                if store:
                    self._store(turn, text, obj)
                done_part = {**part, "text": plan.text}
                done_item = obj["output"][0]
                await resp.write(
                    events.make("response.output_text.done", **where, text=plan.text, logprobs=[])
                    + events.make("response.content_part.done", **where, part=done_part)
                    + events.make("response.output_item.done", output_index=0, item=done_item)
                    + events.make("response.completed", response=obj)
                )
                break
        await resp.write_eof()
        return resp

    # -- the prompt ----------------------------------------------------------------------
    def _conversation(self, body: dict[str, Any]) -> tuple[str, str | None, str | None]:
        """This turn's prompt text (what it continues first), the response and the
        conversation it continues."""
        try:
            prev = previous_response_id(body)
            conv = conversation_id(body)
            if prev is not None and conv is not None:
                raise PromptError("conversation cannot be used with previous_response_id")
            history = None
            if conv is not None:
                if conv not in self.conversations:
                    raise _conversation_not_found(conv)
                history = self.conversations[conv][1] or None
            elif prev is not None:
                history = self.stored.get(prev)
                if history is None:
                    raise _not_found(prev, "previous_response_id")
                self.stored.move_to_end(prev)  # recently continued: kept longest
            turn = render_chat(input_messages(body, instructions=history is None))
        except PromptError as exc:
            text = str(exc)
            raise SurfaceError(text, text.split(" ", 1)[0].split("[", 1)[0]) from None
        return (turn if history is None else history + "\n" + turn), prev, conv


class _Turn:
    """One response being made: its ids, the body asked for and the output plan."""

    __slots__ = ("body", "conversation", "created", "msg_id", "plan", "prev", "rid")

    def __init__(
        self, rid: str, msg_id: str, prev: str | None, body: dict[str, Any], plan: OutputPlan
    ) -> None:
        self.rid, self.msg_id, self.prev, self.body, self.plan = rid, msg_id, prev, body, plan
        self.created = int(time.time())
        self.conversation: str | None = None


class _Events:
    """Server-sent events of one stream, numbered in order."""

    def __init__(self) -> None:
        self.sequence = 0

    def make(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
        return f"event: {kind}\ndata: {payload}\n\n".encode()


def _responses_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """A chat ``usage`` object in the Responses API's field names."""
    return {
        "input_tokens": usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]},
        "output_tokens": usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage["total_tokens"],
    }
