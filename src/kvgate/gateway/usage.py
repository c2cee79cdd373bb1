"""Token usage reported by engines (OpenAI ``usage`` objects), feeding hit feedback."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvgate.tokens import count_tokens


@dataclass(slots=True)
class Usage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def parse_usage(body: dict[str, Any]) -> Usage | None:
    """A chat/completions ``usage``, or the Responses API's (``input_tokens`` …), at the
    top level of a body or inside a stream event's ``response`` object."""
    usage = body.get("usage")
    if not isinstance(usage, dict):
        inner = body.get("response")
        usage = inner.get("usage") if isinstance(inner, dict) else None
        if not isinstance(usage, dict):
            return None
    if "input_tokens" in usage and "prompt_tokens" not in usage:
        details = usage.get("input_tokens_details")
        cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else None
        return Usage(_int(usage.get("input_tokens")), _int(usage.get("output_tokens")), cached)
    details = usage.get("prompt_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else None
    return Usage(_int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens")), cached)


def chunk_generated_tokens(chunk: dict[str, Any]) -> int:
    """Approximate tokens carried by one streamed chunk (exact counts come with usage)."""
    total = 0
    choices = chunk.get("choices")
    if not isinstance(choices, list):
        return 0
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        if isinstance(text, str) and text:
            total += max(1, count_tokens(text))
    return total


def is_usage_only_chunk(chunk: dict[str, Any]) -> bool:
    """The extra chunk an engine sends for ``stream_options.include_usage``."""
    return chunk.get("choices") == [] and isinstance(chunk.get("usage"), dict)


def client_wants_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


def with_usage_requested(body: dict[str, Any]) -> dict[str, Any]:
    options = body.get("stream_options")
    merged = dict(options) if isinstance(options, dict) else {}
    merged["include_usage"] = True
    return {**body, "stream_options": merged}
