"""Turn an OpenAI request body into a RouteRequest (prompt text is not kept)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from kvgate.prompts import (
    PromptError,
    canonical_tools,
    completion_prompt,
    render_chat,
    validate_messages,
)
from kvgate.prompts import stable_prefix as chat_stable_prefix
from kvgate.routing.config import RouteKeyConfig
from kvgate.routing.route_key import kb_version_for, prefix_digest, route_key
from kvgate.tokens import text_block_hashes, text_block_hashes_with_head
from kvgate.types import RouteRequest

DEFAULT_MAX_TOKENS = 256
Endpoint = Literal["chat", "completions"]  # any other value raises PromptError
COMPLETION_KEY_BLOCKS = 4


def _max_tokens(body: Mapping[str, Any]) -> int:
    for field in ("max_completion_tokens", "max_tokens"):
        value = body.get(field)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PromptError(f"{field} must be a positive integer")
        return value
    return DEFAULT_MAX_TOKENS


def _model(body: Mapping[str, Any]) -> str:
    model = body.get("model", "default")
    if model is None:
        return "default"
    if not isinstance(model, str) or not model:
        raise PromptError("model must be a non-empty string")
    return model


def build_route_request(
    body: Mapping[str, Any],
    *,
    endpoint: Endpoint | str,
    headers: Mapping[str, str],
    request_id: str,
    tenant: str,
    priority: int,
    config: RouteKeyConfig,
) -> RouteRequest:
    """Render the canonical prompt, hash its blocks and derive the route key."""
    if not isinstance(body, Mapping):
        raise PromptError("the request body must be a JSON object")
    model = _model(body)
    max_tokens = _max_tokens(body)
    stable: str | None
    head_len = 0  # length of the shared head of the text (system + tools), hashed once
    if endpoint == "chat":
        messages = validate_messages(body.get("messages"))
        tools = body.get("tools")
        canonical_tools(tools)  # validates the field before rendering
        text = render_chat(messages, tools)
        stable = _chat_stable(messages, tools, config)
        head = chat_stable_prefix(messages, tools)
        head_len = len(head) if text.startswith(head) else 0
    elif endpoint == "completions":
        text = completion_prompt(body.get("prompt"))
        stable = None
    else:
        raise PromptError(f"unknown endpoint {endpoint!r}")
    if head_len:
        prompt_tokens, hashes = text_block_hashes_with_head(text, head_len)
    else:
        prompt_tokens, hashes = text_block_hashes(text)
    if stable is None:
        # A raw completion prompt has no structured stable part: its first
        # COMPLETION_KEY_BLOCKS blocks stand in for it (one chained hash covers them all).
        stable = f"blocks:{hashes[min(len(hashes), COMPLETION_KEY_BLOCKS) - 1]}" if hashes else ""
    digest = prefix_digest(stable, kb_version_for(headers, config))
    return RouteRequest(
        request_id=request_id,
        model=model,
        prompt_tokens=prompt_tokens,
        block_hashes=hashes,
        route_key=route_key(model, digest),
        max_tokens=max_tokens,
        tenant=tenant,
        priority=priority,
    )


def _chat_stable(messages: Sequence[Mapping[str, Any]], tools: Any, config: RouteKeyConfig) -> str:
    system = chat_stable_prefix(messages, None) if config.include_system_prompt else ""
    tool_text = canonical_tools(tools) if config.include_tools else ""
    return system + ("\x1ftools=" + tool_text if tool_text else "")


def route_request_from_tokens(
    *,
    request_id: str,
    model: str,
    prompt_tokens: int,
    block_hashes: Sequence[int],
    stable_prefix_digest: str,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    tenant: str = "default",
    priority: int = 0,
    pool: str | None = None,
) -> RouteRequest:
    """A RouteRequest built directly from token figures (the cluster simulator's path)."""
    return RouteRequest(
        request_id=request_id,
        model=model,
        prompt_tokens=prompt_tokens,
        block_hashes=list(block_hashes),
        route_key=route_key(model, stable_prefix_digest),
        max_tokens=max_tokens,
        tenant=tenant,
        priority=priority,
        pool=pool,
    )
