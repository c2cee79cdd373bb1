from __future__ import annotations

from typing import Any

import pytest

from kvgate.prompts import PromptError, render_chat
from kvgate.routing import RouteKeyConfig, build_route_request, route_request_from_tokens
from kvgate.tokens import text_block_hashes

SYSTEM = "You are the support assistant for ACME. " * 20
CFG = RouteKeyConfig()


def chat(user_text: str, *, system: str = SYSTEM, **extra: Any) -> dict[str, Any]:
    return {
        "model": "m1",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user_text}],
        **extra,
    }


def build(body: dict[str, Any], headers: dict[str, str] | None = None, **kw: Any) -> Any:
    return build_route_request(
        body,
        endpoint=kw.pop("endpoint", "chat"),
        headers=headers or {},
        request_id=kw.pop("request_id", "r"),
        tenant=kw.pop("tenant", "t"),
        priority=0,
        config=kw.pop("config", CFG),
    )


def test_blocks_match_the_engine_rendering() -> None:
    body = chat("How do I reset my password?", max_tokens=50)
    req = build(body)
    n, hashes = text_block_hashes(render_chat(body["messages"]))
    assert (req.prompt_tokens, req.block_hashes, req.max_tokens) == (n, hashes, 50)
    assert req.model == "m1" and req.route_key.startswith("m1:")


def test_users_sessions_and_keys_do_not_split_the_route_key() -> None:
    a = build(
        chat("question one", user="alice"), {"Authorization": "Bearer k1", "X-Session-Id": "s1"}
    )
    b = build(
        chat("another question", user="bob"),
        {"Authorization": "Bearer k2", "X-Session-Id": "s2"},
        tenant="other",
    )
    assert a.route_key == b.route_key
    assert a.block_hashes[:10] == b.block_hashes[:10]  # same candidates from the index


def test_stable_prefix_parts_change_the_route_key() -> None:
    base = build(chat("q")).route_key
    assert build(chat("q", system="Another assistant.")).route_key != base
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    assert build(chat("q", tools=tools)).route_key != base
    assert build(chat("q"), {"x-kb-version": "v7"}).route_key != base
    configured = RouteKeyConfig(kb_version="v7")
    assert (
        build(chat("q"), config=configured).route_key
        == build(chat("q"), {"X-KB-Version": "v7"}).route_key
    )
    assert build({**chat("q"), "model": "m2"}).route_key != base


def test_route_key_sources_can_be_switched_off() -> None:
    no_system = RouteKeyConfig(include_system_prompt=False)
    assert (
        build(chat("q"), config=no_system).route_key
        == build(chat("q", system="x"), config=no_system).route_key
    )


def test_completions_endpoint() -> None:
    prompt = "word " * 200
    req = build({"model": "m1", "prompt": prompt}, endpoint="completions")
    assert (req.prompt_tokens, req.block_hashes) == text_block_hashes(prompt)
    other = build({"model": "m1", "prompt": prompt + " tail"}, endpoint="completions")
    assert other.route_key == req.route_key  # same leading blocks, same key


@pytest.mark.parametrize(
    ("body", "endpoint", "field"),
    [
        ({"messages": []}, "chat", "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "chat", r"messages\[0\].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "chat", r"messages\[0\].content"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": "lookup"}, "chat", "tools"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "chat", "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "model": 3}, "chat", "model"),
        ({"prompt": 7}, "completions", "prompt"),
    ],
)
def test_bad_bodies_raise_prompt_error_naming_the_field(
    body: dict[str, Any], endpoint: str, field: str
) -> None:
    with pytest.raises(PromptError, match=field):
        build(body, endpoint=endpoint)


def test_direct_construction_for_the_simulator() -> None:
    req = route_request_from_tokens(
        request_id="s1",
        model="m",
        prompt_tokens=40,
        block_hashes=[1, 2],
        route_key="m:abc",
    )
    assert (
        req.route_key == "m:abc" and req.block_hashes == [1, 2] and req.total_tokens_estimate == 296
    )


def test_unknown_endpoint_is_a_prompt_error() -> None:
    with pytest.raises(PromptError, match="endpoint"):
        build({"prompt": "x"}, endpoint="embeddings")
