"""Turn an OpenAI request body into a RouteRequest (prompt text is not kept)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from kvgate.prompts import (
    PromptError,
    canonical_tools,
    completion_prompt,
    render_chat,
    validate_messages,
)
from kvgate.prompts import stable_prefix as chat_stable_prefix
from kvgate.routing.config import RouteKeyConfig
from kvgate.routing.route_key import kb_version_for, prefix_digest, route_key, route_key_for
from kvgate.tokens import text_block_hashes, text_block_hashes_with_head
from kvgate.types import RouteRequest

if TYPE_CHECKING:
    from kvgate.kv_events.tokenizer import EngineHashes

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
    model: str | None = None,
    engine_hashes: Callable[[str, str, Mapping[str, Any]], EngineHashes | None] | None = None,
) -> RouteRequest:
    """Render the canonical prompt, hash its blocks and derive the route key.

    ``model``: the served model the request resolved to (default: the body's field); the
    route key is built with it, so nothing changes the route's model afterwards.
    ``engine_hashes(model, endpoint, body)``, when given, renders and hashes the prompt the
    way the model's engine does (its chat template and tokenizer, per KV block size; see
    ``kvgate.kv_events``) for the precise cache signal; None when it cannot.
    """
    if not isinstance(body, Mapping):
        raise PromptError("the request body must be a JSON object")
    if model is None:
        model = _model(body)
    max_tokens = _max_tokens(body)
    if endpoint == "chat":
        messages = validate_messages(body.get("messages"))
        tools = body.get("tools")
        canonical_tools(tools)  # validates the field before rendering
        text = render_chat(messages, tools)
        # the shared head (system + tools) is tokenized and hashed once per distinct head
        head = chat_stable_prefix(messages, tools)
        head_len = len(head) if text.startswith(head) else 0
        prompt_tokens, hashes = text_block_hashes_with_head(text, head_len)
        key = route_key_for(model, messages, config=config, tools=tools, headers=headers)
    elif endpoint == "completions":
        text = completion_prompt(body.get("prompt"))
        prompt_tokens, hashes = text_block_hashes(text)
        # A raw completion prompt has no structured stable part: its first
        # COMPLETION_KEY_BLOCKS blocks stand in for it (one chained hash covers them all).
        stable = f"blocks:{hashes[min(len(hashes), COMPLETION_KEY_BLOCKS) - 1]}" if hashes else ""
        key = route_key(model, prefix_digest(stable, kb_version_for(headers, config)))
    else:
        raise PromptError(f"unknown endpoint {endpoint!r}")
    engine = engine_hashes(model, endpoint, body) if engine_hashes is not None else None
    return RouteRequest(
        request_id=request_id,
        model=model,
        prompt_tokens=prompt_tokens,
        block_hashes=hashes,
        route_key=key,
        max_tokens=max_tokens,
        tenant=tenant,
        priority=priority,
        engine_block_hashes=engine.by_block_size if engine is not None else None,
        engine_prompt_tokens=engine.prompt_tokens if engine is not None else None,
    )


def route_request_from_tokens(
    *,
    request_id: str,
    model: str,
    prompt_tokens: int,
    block_hashes: Sequence[int],
    route_key: str,
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
        route_key=route_key,
        max_tokens=max_tokens,
        tenant=tenant,
        priority=priority,
        pool=pool,
    )
