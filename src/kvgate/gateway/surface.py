"""The non-generation OpenAI/vLLM endpoints: embeddings, rerank, score, tokenize, and
creating a conversation (its id is mapped to the node that keeps it, ``responses``).

Each is a request kind of the one pipeline (``handlers.serve``): the body is checked here
(a 400 names the field), its input tokens are counted with kvgate's text model (what
admission reserves: input only, no decode — the output bound is 0), and the route
request carries the kind, so the router sends it by least load to a node whose engine
serves it (``kvgate.routing.endpoints``). The engine answers on the path the client used.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kvgate.gateway.errors import ApiError
from kvgate.prompts import PromptError, render_chat
from kvgate.routing.endpoints import (
    CONVERSATIONS,
    DETOKENIZE,
    EMBEDDINGS,
    RERANK,
    SCORE,
    TOKENIZE,
)
from kvgate.routing.responses_input import input_messages
from kvgate.tokens import count_tokens
from kvgate.types import RouteRequest


def _bad(param: str, expected: str) -> ApiError:
    return ApiError(400, f"'{param}' must be {expected}", param=param, code="invalid_type")


def _missing(param: str) -> ApiError:
    return ApiError(400, f"missing required field '{param}'", param=param, code="missing_field")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _texts(body: Mapping[str, Any], param: str) -> list[str]:
    """A required string or non-empty list of strings."""
    if param not in body:
        raise _missing(param)
    value = body[param]
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return value
    raise _bad(param, "a string or a non-empty list of strings")


def _embeddings_tokens(body: Mapping[str, Any]) -> int:
    if "input" not in body:
        raise _missing("input")
    value = body["input"]
    if isinstance(value, list) and value and all(_is_int(t) for t in value):
        return len(value)  # one input as token ids
    if (
        isinstance(value, list)
        and value
        and all(isinstance(t, list) and t and all(_is_int(i) for i in t) for t in value)
    ):
        return sum(len(t) for t in value)
    texts = _texts(body, "input")
    dims = body.get("dimensions")
    if dims is not None and (not _is_int(dims) or dims < 1):
        raise _bad("dimensions", "a positive integer")
    encoding = body.get("encoding_format")
    if encoding is not None and encoding not in ("float", "base64"):
        raise _bad("encoding_format", "'float' or 'base64'")
    return sum(count_tokens(t) for t in texts)


def _rerank_tokens(body: Mapping[str, Any]) -> int:
    query = body.get("query")
    if "query" not in body:
        raise _missing("query")
    if not isinstance(query, str):
        raise _bad("query", "a string")
    if "documents" not in body:
        raise _missing("documents")
    docs = body["documents"]
    if not isinstance(docs, list) or not docs:
        raise _bad("documents", "a non-empty list of strings or {text} objects")
    texts: list[str] = []
    for i, doc in enumerate(docs):
        if isinstance(doc, Mapping):
            doc = doc.get("text")
        if not isinstance(doc, str):
            raise _bad(f"documents[{i}]", "a string or an object with a string 'text'")
        texts.append(doc)
    top_n = body.get("top_n")
    if top_n is not None and (not _is_int(top_n) or top_n < 1):
        raise _bad("top_n", "a positive integer")
    q = count_tokens(query)
    return sum(q + count_tokens(d) for d in texts)  # the query is read with each document


def _score_tokens(body: Mapping[str, Any]) -> int:
    first = _texts(body, "text_1")
    second = _texts(body, "text_2")
    if len(first) == 1:
        first = first * len(second)
    if len(first) != len(second):
        raise ApiError(
            400,
            "'text_1' and 'text_2' must have the same length (or 'text_1' one item)",
            param="text_2",
            code="invalid_value",
        )
    return sum(count_tokens(a) + count_tokens(b) for a, b in zip(first, second, strict=True))


def _tokenize_tokens(body: Mapping[str, Any]) -> int:
    if "messages" in body:
        try:
            return count_tokens(render_chat(body["messages"], body.get("tools")))
        except (PromptError, TypeError, AttributeError):
            raise _bad("messages", "a non-empty list of message objects") from None
    if "prompt" not in body:
        raise _missing("prompt")
    if not isinstance(body["prompt"], str):
        raise _bad("prompt", "a string")
    return count_tokens(body["prompt"])


def _detokenize_tokens(body: Mapping[str, Any]) -> int:
    if "tokens" not in body:
        raise _missing("tokens")
    tokens = body["tokens"]
    if not isinstance(tokens, list) or not all(_is_int(t) for t in tokens):
        raise _bad("tokens", "a list of integer token ids")
    return len(tokens)


def _conversation_tokens(body: Mapping[str, Any]) -> int:
    """A new conversation's initial items (none: an empty conversation)."""
    if body.get("items") is None:
        return 0
    try:
        return count_tokens(render_chat(input_messages({"input": body["items"]})))
    except PromptError as exc:
        raise _bad("items", f"a non-empty list of input items ({exc})") from None


@dataclass(frozen=True, slots=True)
class SurfaceKind:
    """One non-generation endpoint kind: its client paths and its input-token count."""

    kind: str
    paths: tuple[str, ...]  # client paths; the engine is sent the same one
    input_tokens: Callable[[Mapping[str, Any]], int]  # validates too (ApiError 400)


SURFACE_KINDS: tuple[SurfaceKind, ...] = (
    SurfaceKind(EMBEDDINGS, ("/v1/embeddings",), _embeddings_tokens),
    SurfaceKind(RERANK, ("/v1/rerank", "/rerank", "/v2/rerank"), _rerank_tokens),
    SurfaceKind(SCORE, ("/v1/score", "/score"), _score_tokens),
    SurfaceKind(TOKENIZE, ("/tokenize",), _tokenize_tokens),
    SurfaceKind(DETOKENIZE, ("/detokenize",), _detokenize_tokens),
    SurfaceKind(CONVERSATIONS, ("/v1/conversations",), _conversation_tokens),
)
BY_KIND = {k.kind: k for k in SURFACE_KINDS}


def input_tokens(kind: str, body: Mapping[str, Any]) -> int:
    """The request's input tokens (what admission reserves); ApiError 400 for a bad body."""
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise _bad("model", "a non-empty string")
    if body.get("stream") not in (None, False):
        raise ApiError(
            400, f"'stream' is not supported for {kind}", param="stream", code="invalid_value"
        )
    return max(1, BY_KIND[kind].input_tokens(body))


def surface_route(
    kind: str,
    *,
    request_id: str,
    model: str,
    prompt_tokens: int,
    tenant: str,
    priority: int,
) -> RouteRequest:
    """The route request of a non-generation call: no prefix blocks, no decode."""
    return RouteRequest(
        request_id=request_id,
        model=model,
        prompt_tokens=prompt_tokens,
        block_hashes=[],
        route_key=f"{model}#{kind}",
        max_tokens=0,
        tenant=tenant,
        priority=priority,
        endpoint=kind,
    )
