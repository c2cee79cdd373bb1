"""The simulator's prompt cache gives the tokens and block hashes of the full rendering."""

from __future__ import annotations

from typing import Any

import pytest

from kvgate.prompts import render_chat, render_chat_parts, stable_prefix
from kvgate.tokens import block_hashes, tokenize
from kvgate.workloads import PromptCache, WorkItem

CASES: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "why?"}],
    [
        {"role": "developer", "content": "D"},
        {"role": "system", "content": [{"type": "text", "text": "x"}]},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None},
        {"role": "developer", "content": "late"},
        {"role": "tool", "content": "t"},
    ],
]
TOOLS = [None, [{"type": "function", "function": {"name": "f"}}]]


@pytest.mark.parametrize("messages", CASES)
@pytest.mark.parametrize("tools", TOOLS)
def test_render_chat_parts_split_the_full_rendering(
    messages: list[dict[str, Any]], tools: Any
) -> None:
    stable, rest = render_chat_parts(messages, tools)
    assert stable == stable_prefix(messages, tools)
    assert stable + rest == render_chat(messages, tools)


@pytest.mark.parametrize("messages", CASES)
def test_prompt_cache_matches_plain_tokenizing(messages: list[dict[str, Any]]) -> None:
    cache = PromptCache()
    item = WorkItem("r", 0.0, "t", [*messages, {"role": "user", "content": " word" * 40}], 8)
    pieces = tokenize(render_chat(item.messages))
    for _ in range(2):  # the second time the stable part comes from the cache
        got = cache.prompt(item)
        assert got.prompt_tokens == len(pieces)
        assert got.block_hashes == block_hashes(pieces)


def test_prompt_cache_tells_apart_system_prompts_that_end_alike() -> None:
    # the cache is keyed by a stable text's length and end: texts sharing both still get
    # their own tokens and hashes
    cache = PromptCache()
    end = " same ending" * 20
    items = [
        WorkItem(f"r{i}", 0.0, "t", [{"role": "system", "content": head + end}, user], 8)
        for i, head in enumerate(["alpha beta", "gamma delt", "alpha beta"])
        for user in ({"role": "user", "content": f"question {i}"},)
    ]
    for _ in range(2):
        for item in items:
            pieces = tokenize(render_chat(item.messages))
            got = cache.prompt(item)
            assert (got.prompt_tokens, got.block_hashes) == (len(pieces), block_hashes(pieces))
