"""A deterministic corpus of chat and completion request bodies for render parity checks.

System prompts shared across requests, multi-turn histories, tools and assistant tool
calls (arguments as JSON strings, ASCII-escaped or not, empty and invalid), tool results, content as
strings and as text parts, developer messages, non-ASCII text, and completions.
"""

from __future__ import annotations

import json
import random
from typing import Any

WORDS = [
    "cache",
    "prefix",
    "block",
    "engine",
    "model",
    "prompt",
    "reply",
    "route",
    "node",
    "gateway",
    "server",
    "latency",
    "queue",
    "memory",
    "batch",
    "decode",
    "prefill",
    "stream",
    "chat",
    "tool",
    "answer",
    "question",
    "document",
    "summary",
    "café",
    "naïve",
    "東京",
    "ünïcødé",
    "{json}",
    "<tag>",
    '"quoted"',
    "back\\slash",
    "tab\there",
]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city — °C",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "search_docs", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "no_params", "description": "nothing", "x": 1}},
]


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _tool_call(rng: random.Random, i: int) -> dict[str, Any]:
    kind = i % 4
    arguments: Any
    if kind == 0:
        arguments = json.dumps({"city": words(rng, 2), "unit": "c"}, ensure_ascii=False)
    elif kind == 1:
        arguments = json.dumps({"query": words(rng, 3), "k": 3})
    elif kind == 2:
        arguments = ""
    else:
        arguments = "{not json"
    name = ("get_weather", "search_docs", "no_params", "get_weather")[kind]
    return {
        "id": f"call_{i}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def chat_body(seed: int, systems: list[str]) -> dict[str, Any]:
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = []
    style = seed % 7
    if style != 6:
        system: Any = systems[seed % len(systems)]
        if style == 3:
            system = [{"type": "text", "text": system}]
        messages.append({"role": "developer" if style == 5 else "system", "content": system})
    turns = 1 + seed % 4
    for t in range(turns):
        user: Any = words(rng, rng.randint(3, 40))
        if style == 2:
            user = [{"type": "text", "text": user}, {"type": "text", "text": words(rng, 4)}]
        messages.append({"role": "user", "content": user})
        if t == turns - 1:
            break
        if style in (1, 4) and t % 2 == 0:
            calls = [_tool_call(rng, seed + t + k) for k in range(1 + (seed + t) % 2)]
            messages.append({"role": "assistant", "content": None, "tool_calls": calls})
            for call in calls:
                result: Any = words(rng, 6)
                if style == 4:
                    result = [{"type": "text", "text": result}]
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        else:
            messages.append({"role": "assistant", "content": words(rng, rng.randint(2, 30))})
    body: dict[str, Any] = {"model": "tiny", "messages": messages, "max_tokens": 2}
    if style in (1, 4):
        body["tools"] = TOOLS[: 1 + seed % 3]
        body["tool_choice"] = "none"  # "auto" needs a tool parser on the engine
    if seed % 11 == 0:
        body["add_generation_prompt"] = False
    return body


def completion_body(seed: int, systems: list[str]) -> dict[str, Any]:
    rng = random.Random(seed)
    prompt = systems[seed % len(systems)] + "\n" + words(rng, rng.randint(1, 50))
    return {"model": "tiny", "prompt": prompt, "max_tokens": 2}


def system_prompts(count: int = 4, length: int = 120, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [f"You are agent {i}. " + words(rng, length) for i in range(count)]


def corpus(n_chat: int = 160, n_completions: int = 50) -> list[tuple[str, dict[str, Any]]]:
    """(endpoint, body) pairs: ``n_chat`` chat requests, then ``n_completions`` completions."""
    systems = system_prompts()
    out: list[tuple[str, dict[str, Any]]] = [
        ("chat", chat_body(seed, systems)) for seed in range(n_chat)
    ]
    out += [("completions", completion_body(seed, systems)) for seed in range(n_completions)]
    return out
