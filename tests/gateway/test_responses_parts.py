"""The Responses API's pieces on the byte path: stream end, generated tokens, first token,
usage, and the watch that reads response ids (against a real in-memory store)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from prometheus_client import CollectorRegistry

from kvgate.clock import ManualClock
from kvgate.gateway.bytepath import count_generated, ends_response_stream
from kvgate.gateway.response_map import Holder, ResponseMap, response_key
from kvgate.gateway.responses import ResponseWatch, gone_reason
from kvgate.gateway.usage import parse_usage
from kvgate.pipeline import Flow
from kvgate.pipeline.first_token import events_bear_content
from kvgate.routing import NodeView, RoutingConfig
from kvgate.store.memory import MemoryStore
from kvgate.types import NodeSpec, NodeState, RouteDecision, RouteRequest


def _event(kind: str, **fields: Any) -> bytes:
    data = json.dumps({"type": kind, **fields}, separators=(",", ":"))
    return f"event: {kind}\ndata: {data}\n\n".encode()


USAGE = {"input_tokens": 30, "input_tokens_details": {"cached_tokens": 16},
         "output_tokens": 3, "total_tokens": 33}  # fmt: skip
CREATED = _event("response.created", response={"id": "resp_1", "status": "in_progress"})
DELTAS = b"".join(_event("response.output_text.delta", delta=t) for t in ("a", "b", "c"))
DONE = _event("response.output_text.done", text="abc") + _event(
    "response.completed", response={"id": "resp_1", "status": "completed", "usage": USAGE}
)


def test_a_responses_stream_is_read_like_a_chat_stream() -> None:
    assert count_generated(DELTAS) == 3
    assert count_generated(DELTAS + DONE) == 3  # the done events repeat the text: not counted
    assert not events_bear_content(CREATED)
    assert events_bear_content(_event("response.output_text.delta", delta="x"))
    assert not events_bear_content(_event("response.output_text.delta", delta=""))
    assert not ends_response_stream(CREATED + DELTAS)
    assert ends_response_stream(DONE)
    assert ends_response_stream(_event("response.failed", response={"id": "r"}))
    completed = json.loads(DONE.split(b"data: ")[-1])
    usage = parse_usage(completed)
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens) == (30, 3, 16)
    chat = parse_usage({"usage": {"prompt_tokens": 5, "completion_tokens": 2}})
    assert chat is not None and (chat.prompt_tokens, chat.completion_tokens) == (5, 2)


def test_holder_round_trips_and_bad_values_read_as_unknown() -> None:
    h = Holder("e1", 120, 1700000000.5)
    assert Holder.decode(h.encode()) == h
    assert Holder.decode("not json") is None
    assert Holder.decode('{"tokens": 3}') is None
    assert Holder.decode('{"node": "e0", "tokens": -4}') == Holder("e0", 0, None)


def _setup() -> tuple[MemoryStore, ResponseMap, NodeView, Flow]:
    clock = ManualClock(100.0)
    store = MemoryStore(clock)
    rmap = ResponseMap(store, CollectorRegistry(), ttl_s=60.0)
    nodes = NodeView(clock, RoutingConfig())
    nodes.add_node(NodeSpec("e0", "http://127.0.0.1:1"))
    nodes.add_node(NodeSpec("e1", "http://127.0.0.1:2"))
    route = RouteRequest("r", "m", 30, [], "k", endpoint="responses")
    flow = Flow(route)
    flow.decision = RouteDecision("e1", "least_load_miss", 0, "hybrid")
    return store, rmap, nodes, flow


async def test_stream_watch_writes_at_created_and_updates_at_completed() -> None:
    store, rmap, nodes, flow = _setup()
    tasks: list[asyncio.Task[Any]] = []

    def spawn(coro: Any) -> asyncio.Task[Any]:
        tasks.append(asyncio.ensure_future(coro))
        return tasks[-1]

    watch = ResponseWatch(rmap, flow, nodes, spawn)
    watch.events(CREATED[:20])  # a partial run carries no whole event
    watch.events(CREATED + DELTAS)
    await asyncio.gather(*tasks)
    first = await store.get(response_key("resp_1"))
    assert first is not None and Holder.decode(first) == Holder("e1", 30, None)
    watch.events(DONE)
    await watch.finish()
    final = await store.get(response_key("resp_1"))
    assert final is not None and Holder.decode(final) == Holder("e1", 33, None)
    assert await rmap.lookup("resp_1") == Holder("e1", 33, None)
    assert await rmap.lookup("resp_other") is None
    assert rmap.lookups.labels("miss")._value.get() == 1


async def test_unary_watch_and_gone_reasons() -> None:
    store, rmap, nodes, flow = _setup()
    watch = ResponseWatch(rmap, flow, nodes, asyncio.ensure_future)
    watch.payload({"object": "chat.completion", "id": "chatcmpl-1"})
    await watch.finish()
    assert await store.get(response_key("chatcmpl-1")) is None  # not a response object
    watch.payload({"object": "response", "id": "resp_2", "usage": USAGE})
    await watch.finish()
    holder = await rmap.lookup("resp_2")
    assert holder == Holder("e1", 33, None)
    specs = {"e0": object(), "e1": object()}
    assert gone_reason(holder, nodes, specs, frozenset()) is None
    assert gone_reason(holder, nodes, specs, frozenset({"e1"})) == "ejected"
    assert gone_reason(holder, nodes, {"e0": object()}, frozenset()) == "removed"
    nodes.set_state("e1", NodeState.UNREACHABLE)
    assert gone_reason(holder, nodes, specs, frozenset()) == "unreachable"
    nodes.set_state("e1", NodeState.HEALTHY)
    nodes.get("e1").process_start_time = 5000.0  # type: ignore[union-attr]
    assert gone_reason(Holder("e1", 3, 4000.0), nodes, specs, frozenset()) == "restarted"
    assert gone_reason(Holder("e1", 3, 5000.0), nodes, specs, frozenset()) is None
