"""``POST /v1/responses``: the Responses API as a request kind of the one pipeline.

The body's turn (``instructions`` + ``input``, ``kvgate.routing.responses_input``) is
rendered as chat messages: their blocks are hashed for cache affinity and counted for
admission (input + ``max_output_tokens``, or the admission default), exactly as a chat
request. A ``previous_response_id`` (or a ``conversation``: engine-sim serves the
Conversations API, vLLM does not) is looked up in the replicas' shared map
(``response_map``): found, the request is pinned to the node that made that response
(route reason ``previous_response``), its prompt counted with the stored conversation's
tokens, which that node is expected to hold cached; found but the node is gone (removed,
ejected, unreachable, restarted, or it does not answer the attempt), a 404
``previous_response_not_found`` says so; unknown, it is routed as a new turn (the
engine answers 404 if it does not hold it either).

Each answer's response id is read as it passes, without holding the stream back: from
the JSON body, or from the stream's ``response.created`` event (written to the map at
once, so a follow-up never arrives before its entry) and ``response.completed`` (the
entry updated with the conversation's final token count). A unary answer is returned
only once its entry is written. ``store: false`` responses are not mapped. A created
conversation (``POST /v1/conversations``, least-load routed) is mapped from its body, and
a response in it updates the conversation's entry.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any

from kvgate.gateway.errors import ApiError
from kvgate.gateway.response_map import Holder, ResponseMap
from kvgate.gateway.sse import parse_event
from kvgate.gateway.usage import parse_usage
from kvgate.pipeline import Flow
from kvgate.prompts import PromptError
from kvgate.routing import build_route_request
from kvgate.routing.config import RouteKeyConfig
from kvgate.routing.endpoints import RESPONSES
from kvgate.routing.node_view import NodeView
from kvgate.routing.responses_input import conversation_id, input_messages, previous_response_id
from kvgate.tokens import BLOCK_SIZE
from kvgate.types import NodeState, RoutePin, RouteRequest

if TYPE_CHECKING:
    from kvgate.kv_events.tokenizer import EngineHashes

PATH = "/v1/responses"
OUTPUT_BOUND_FIELD = "max_output_tokens"
NOT_FOUND_CODE = "previous_response_not_found"
_CREATED = b'"response.created"'
_COMPLETED = b'"response.completed"'
Spawn = Callable[[Coroutine[Any, Any, Any]], "asyncio.Task[Any]"]


def _bad(param: str, expected: str) -> ApiError:
    return ApiError(400, f"'{param}' must be {expected}", param=param, code="invalid_type")


def validate(body: Mapping[str, Any]) -> None:
    """400 for a malformed field the gateway reads (the engine checks the rest)."""
    bound = body.get(OUTPUT_BOUND_FIELD)
    if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int) or bound < 1):
        raise _bad(OUTPUT_BOUND_FIELD, "a positive integer")
    if not isinstance(body.get("stream", False), bool | None):
        raise _bad("stream", "a boolean")
    if not isinstance(body.get("store", True), bool | None):
        raise _bad("store", "a boolean")


def _prompt_error(exc: PromptError) -> ApiError:
    text = str(exc)
    param = text.split(" ", 1)[0].split("[", 1)[0] if text else None
    return ApiError(400, text, param=param, code="invalid_prompt")


def gone_reason(
    holder: Holder, nodes: NodeView, configured: Mapping[str, object], ejected: frozenset[str]
) -> str | None:
    """Why the node holding a response cannot answer for it any more (None: it can)."""
    entry = nodes.get(holder.node_id)
    if entry is None or holder.node_id not in configured:
        return "removed"
    if holder.node_id in ejected:
        return "ejected"
    if entry.state is NodeState.UNREACHABLE:
        return "unreachable"
    started = entry.process_start_time
    if holder.started is not None and started is not None and abs(started - holder.started) > 1:
        return "restarted"
    return None


def node_gone_error(state_id: str, node_id: str, why: str) -> ApiError:
    """404: the response (or conversation) ``state_id`` continues is on a node gone."""
    conversation = state_id.startswith("conv")
    param = "conversation" if conversation else "previous_response_id"
    what = "Conversation" if conversation else "Previous response"
    return ApiError(
        404,
        f"{what} with id '{state_id}' cannot be continued: node {node_id}, which holds "
        f"it, is gone ({why}). Start a new conversation without {param}.",
        param=param,
        code=NOT_FOUND_CODE,
    )


def continued_id(body: Mapping[str, Any]) -> str | None:
    """The stored response or conversation a body continues (PromptError if both)."""
    prev, conv = previous_response_id(body), conversation_id(body)
    if prev is not None and conv is not None:
        raise PromptError("conversation cannot be used with previous_response_id")
    return prev or conv


async def route_request(
    body: Mapping[str, Any],
    *,
    response_map: ResponseMap,
    nodes: NodeView,
    configured: Mapping[str, object],
    ejected: Callable[[], frozenset[str]],
    headers: Mapping[str, str],
    request_id: str,
    tenant: str,
    priority: int,
    config: RouteKeyConfig,
    model: str,
    engine_hashes: Callable[[str, str, Mapping[str, Any]], EngineHashes | None] | None,
) -> RouteRequest:
    """The route of a Responses request: its turn, pinned to the holder of the response it
    continues when the map knows it; ApiError 400 (bad body) or 404 (the holder is gone)."""
    try:
        prev = continued_id(body)
        messages = input_messages(body, instructions=prev is None)
    except PromptError as exc:
        raise _prompt_error(exc) from None
    chat = {"messages": messages, "max_tokens": body.get(OUTPUT_BOUND_FIELD)}
    try:
        route = build_route_request(
            {k: v for k, v in chat.items() if v is not None},
            endpoint="chat",
            headers=headers,
            request_id=request_id,
            tenant=tenant,
            priority=priority,
            config=config,
            model=model,
            engine_hashes=engine_hashes if prev is None else None,
        )
    except PromptError as exc:
        raise _prompt_error(exc) from None
    route.endpoint = RESPONSES
    if prev is None:
        return route
    holder = await response_map.lookup(prev)
    if holder is None:
        return route
    why = gone_reason(holder, nodes, configured, ejected())
    if why is not None:
        response_map.node_gone(why)
        raise node_gone_error(prev, holder.node_id, why)
    response_map.hit()
    # the engine's prompt is the stored conversation, then this turn: the turn's own
    # blocks are not a prefix there, so none is placed in the index
    route.block_hashes = []
    route.prompt_tokens += holder.tokens
    route.pin = RoutePin(holder.node_id, holder.tokens // BLOCK_SIZE * BLOCK_SIZE)
    return route


class ResponseWatch:
    """Reads the response id (and final token count) of one answer as it passes and
    writes it to the map against the node that answered (``proxy.AnswerWatch``)."""

    def __init__(
        self, response_map: ResponseMap, flow: Flow, nodes: NodeView, spawn: Spawn
    ) -> None:
        self.map = response_map
        self.flow = flow
        self.nodes = nodes
        self.spawn = spawn
        self.response_id: str | None = None
        self.conversation: str | None = None  # the conversation the answer extends
        self.node_id: str | None = None
        self.final_tokens: int | None = None
        self._written: asyncio.Task[Any] | None = None

    def _holder(self, tokens: int) -> Holder:
        assert self.node_id is not None
        entry = self.nodes.get(self.node_id)
        return Holder(self.node_id, tokens, entry.process_start_time if entry else None)

    def _seen(self, response_id: Any) -> bool:
        if not isinstance(response_id, str) or not response_id or self.flow.decision is None:
            return False
        self.response_id = response_id
        self.node_id = self.flow.decision.node_id
        return True

    def _completed(self, body: dict[str, Any]) -> None:
        response = body.get("response", body)
        conversation = response.get("conversation") if isinstance(response, dict) else None
        if isinstance(conversation, dict) and isinstance(conversation.get("id"), str):
            self.conversation = conversation["id"]
        usage = parse_usage(body)
        if usage is not None and usage.prompt_tokens is not None:
            self.final_tokens = usage.prompt_tokens + (usage.completion_tokens or 0)

    # -- proxy.AnswerWatch ----------------------------------------------------------------
    def events(self, events: bytes) -> None:
        if _CREATED not in events and _COMPLETED not in events:
            return
        for raw in events.split(b"\n\n"):
            if _CREATED in raw and self.response_id is None:
                data = parse_event(raw).json()
                response = data.get("response") if data is not None else None
                rid = response.get("id") if isinstance(response, dict) else None
                if self._seen(rid):
                    # written now: the client may chain on the id as soon as it ends
                    holder = self._holder(self.flow.route.prompt_tokens)
                    self._written = self.spawn(self.map.record(str(rid), holder))
            elif _COMPLETED in raw and self.response_id is not None:
                data = parse_event(raw).json()
                if data is not None and data.get("type") == "response.completed":
                    self._completed(data)

    def payload(self, body: dict[str, Any]) -> None:
        kind = body.get("object")
        if kind == "response" and self._seen(body.get("id")):
            self._completed(body)
        elif kind == "conversation":
            self._seen(body.get("id"))  # a new conversation, empty or with its items

    async def finish(self) -> None:
        """Write what the answer said (after it ended; a unary one before it is returned)."""
        if self._written is not None:
            await asyncio.shield(self._written)
        if self.response_id is not None and (self._written is None or self.final_tokens):
            holder = self._holder(self.final_tokens or self.flow.route.prompt_tokens)
            await self.map.record(self.response_id, holder)
            if self.conversation is not None:  # the conversation now ends with this turn
                await self.map.record(self.conversation, holder)
