"""Canonical rendering of OpenAI request bodies to prompt text.

The engine simulator renders chat messages with ``render_chat`` before tokenizing, and
the gateway renders the same way to estimate prompt tokens and compute block hashes, so
the gateway's prefix index lines up with the engine's KV blocks.

Template (documented in docs/engine-model.md)::

    <|system|>\n{system text}\n        (one section per message, in order)
    <|tools|>\n{tools as canonical JSON}\n   (after the leading system messages, if any)
    <|user|>\n{user text}\n
    <|assistant|>\n                        (generation prompt)

``stable_prefix`` returns the part of a request that does not depend on the user's
question: leading system messages and tool schemas. It feeds the route key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any


class PromptError(ValueError):
    """The request body cannot be rendered (names the offending field)."""


def message_text(content: Any, field: str = "messages[].content") -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for i, part in enumerate(content):
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and part.get("type") == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise PromptError(f"{field}[{i}].text must be a string")
                parts.append(text)
            elif isinstance(part, Mapping):
                # Non-text parts (images, audio) are represented by their type only.
                parts.append(f"<{part.get('type', 'part')}>")
            else:
                raise PromptError(f"{field}[{i}] must be a string or a content part object")
        return "".join(parts)
    raise PromptError(f"{field} must be a string or a list of content parts")


def canonical_tools(tools: Any) -> str:
    if not tools:
        return ""
    if not isinstance(tools, list):
        raise PromptError("tools must be a list")
    return json.dumps(tools, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _leading_system_count(messages: Sequence[Mapping[str, Any]]) -> int:
    n = 0
    for m in messages:
        if m.get("role") in ("system", "developer"):
            n += 1
        else:
            break
    return n


def validate_messages(messages: Any) -> list[Mapping[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise PromptError("messages must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise PromptError(f"messages[{i}] must be an object")
        role = m.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool", "function"):
            raise PromptError(f"messages[{i}].role is missing or unknown: {role!r}")
        message_text(m.get("content"), f"messages[{i}].content")
    return messages


def render_chat(messages: Sequence[Mapping[str, Any]], tools: Any = None) -> str:
    """Render chat messages (and tools) to the canonical prompt text."""
    validate_messages(list(messages))
    out: list[str] = []
    n_sys = _leading_system_count(messages)
    tools_text = canonical_tools(tools)
    for i, m in enumerate(messages):
        role = "system" if m.get("role") == "developer" else m.get("role")
        out.append(f"<|{role}|>\n{message_text(m.get('content'))}\n")
        if i == n_sys - 1 and tools_text:
            out.append(f"<|tools|>\n{tools_text}\n")
    if n_sys == 0 and tools_text:
        out.insert(0, f"<|tools|>\n{tools_text}\n")
    out.append("<|assistant|>\n")
    return "".join(out)


def render_chat_parts(messages: Sequence[Mapping[str, Any]], tools: Any = None) -> tuple[str, str]:
    """``(stable_prefix(messages, tools), rest)`` with ``render_chat(messages, tools)`` equal
    to their concatenation: the stable part is rendered once, never copied inside a full
    rendering (a simulator tokenizing long shared system prompts per request)."""
    validate_messages(list(messages))
    n_sys = _leading_system_count(messages)
    stable = stable_prefix(messages, tools)
    rest = [
        f"<|{'system' if m.get('role') == 'developer' else m.get('role')}|>\n"
        f"{message_text(m.get('content'))}\n"
        for m in messages[n_sys:]
    ]
    rest.append("<|assistant|>\n")
    return stable, "".join(rest)


def stable_prefix(messages: Sequence[Mapping[str, Any]], tools: Any = None) -> str:
    """Leading system messages plus tool schemas: the part shared across users."""
    n_sys = _leading_system_count(messages)
    parts = [f"<|system|>\n{message_text(m.get('content'))}\n" for m in messages[:n_sys]]
    tools_text = canonical_tools(tools)
    if tools_text:
        parts.append(f"<|tools|>\n{tools_text}\n")
    return "".join(parts)


def completion_prompt(prompt: Any) -> str:
    """The prompt text of a /v1/completions body (a string or a one-element list)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0]
    if isinstance(prompt, list) and all(isinstance(p, int) for p in prompt):
        raise PromptError("prompt as token ids is not supported; send text")
    raise PromptError("prompt must be a string (or a list with one string)")
