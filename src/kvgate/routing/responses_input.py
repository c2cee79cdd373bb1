"""A Responses API body's input as chat messages (one reading for gateway and engine-sim).

``instructions`` becomes a leading system message; ``input`` is a string (one user
message) or a list of input items: messages (``content`` a string or a list of parts
whose ``text`` is read; a part without text, e.g. an image, is read as its JSON),
``function_call`` and ``function_call_output`` items (read as assistant and tool turns),
and any other item type as its JSON, so an item kvgate does not know still shapes the
prompt's hash instead of failing the request. The gateway hashes the rendered messages
for cache affinity and counts them for admission; engine-sim renders the same messages.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kvgate.prompts import PromptError

_ROLES = frozenset({"user", "assistant", "system", "developer"})


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def _content_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                parts.append(_json(part))
        return "".join(parts)
    raise PromptError(f"{where}.content must be a string or a list of content parts")


def _item_message(item: Any, i: int) -> dict[str, str]:
    where = f"input[{i}]"
    if not isinstance(item, Mapping):
        raise PromptError(f"{where} must be an object")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role", "user")
        if role not in _ROLES:
            raise PromptError(f"{where}.role is missing or unknown: {role!r}")
        return {"role": str(role), "content": _content_text(item.get("content"), where)}
    if kind == "function_call":
        call = f"{item.get('name', '')}({item.get('arguments', '')})"
        return {"role": "assistant", "content": call}
    if kind == "function_call_output":
        output = item.get("output")
        return {"role": "tool", "content": output if isinstance(output, str) else _json(output)}
    return {"role": "user", "content": _json(item)}


def input_messages(body: Mapping[str, Any], *, instructions: bool = True) -> list[dict[str, str]]:
    """The body's turn as chat messages; PromptError (a 400) for a malformed field.

    ``instructions``: whether a leading system message is made of ``instructions``."""
    text = body.get("instructions")
    if text is not None and not isinstance(text, str):
        raise PromptError("instructions must be a string")
    messages: list[dict[str, str]] = []
    if instructions and text:
        messages.append({"role": "system", "content": text})
    if "input" not in body:
        raise PromptError("input is required")
    raw = body["input"]
    if isinstance(raw, str):
        messages.append({"role": "user", "content": raw})
    elif isinstance(raw, list) and raw:
        messages.extend(_item_message(item, i) for i, item in enumerate(raw))
    else:
        raise PromptError("input must be a string or a non-empty list of input items")
    return messages


def previous_response_id(body: Mapping[str, Any]) -> str | None:
    """The body's ``previous_response_id`` (PromptError unless a non-empty string or null)."""
    value = body.get("previous_response_id")
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise PromptError("previous_response_id must be a non-empty string")
    return value


def conversation_id(body: Mapping[str, Any]) -> str | None:
    """The body's ``conversation``: an id string or ``{"id": …}`` (PromptError otherwise)."""
    value = body.get("conversation")
    if value is None:
        return None
    if isinstance(value, Mapping):
        value = value.get("id")
    if not isinstance(value, str) or not value:
        raise PromptError("conversation must be a conversation id or an object with an 'id'")
    return value
