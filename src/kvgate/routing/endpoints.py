"""Endpoint kinds: what a request asks of an engine, and which engines serve it.

``generate`` (chat and completions) and ``responses`` (the Responses API) are routed by
the configured policy (cache affinity); a Responses request that continues a stored
response (``previous_response_id``) or conversation (``conversation``) is pinned to the
node holding it (``RoutePin``).
Every other kind here reads its input once and generates nothing, so a prefix cache
does not help it: it goes to the least-loaded eligible node. Which engine types serve
which kinds follows their OpenAI-compatible servers (vLLM serves them all, as does
engine-sim); a node is eligible for a kind only if its engine type serves it
(``filters.endpoint_filter``), and a kind no configured node serves is answered 404.
"""

from __future__ import annotations

GENERATE = "generate"
EMBEDDINGS = "embeddings"
RERANK = "rerank"
SCORE = "score"
TOKENIZE = "tokenize"
DETOKENIZE = "detokenize"
RESPONSES = "responses"
CONVERSATIONS = "conversations"  # the Conversations API's create (state kept in the engine)

ALL_ENDPOINTS = frozenset(
    {GENERATE, EMBEDDINGS, RERANK, SCORE, TOKENIZE, DETOKENIZE, RESPONSES, CONVERSATIONS}
)
# routed with the configured policy (prefix cache affinity); the rest by least load
CACHE_AFFINE = frozenset({GENERATE, RESPONSES})

ENGINE_ENDPOINTS: dict[str, frozenset[str]] = {
    # vLLM serves the Responses API but not the Conversations API
    "vllm": ALL_ENDPOINTS - {CONVERSATIONS},
    "sim": ALL_ENDPOINTS,
    # SGLang's /tokenize and /score differ in path or shape, and its /v1/responses keeps
    # no vLLM-style stored state; TGI embeds in a separate server (TEI); llama.cpp's
    # tokenize bodies differ
    "sglang": frozenset({GENERATE, EMBEDDINGS, RERANK}),
    "llamacpp": frozenset({GENERATE, EMBEDDINGS, RERANK}),
    "tgi": frozenset({GENERATE}),
}


def serves(engine_type: str, endpoint: str) -> bool:
    """Whether an engine of ``engine_type`` serves ``endpoint`` (unknown types: generate)."""
    return endpoint in ENGINE_ENDPOINTS.get(engine_type, CACHE_AFFINE)


def engine_types_serving(endpoint: str) -> list[str]:
    return sorted(t for t, kinds in ENGINE_ENDPOINTS.items() if endpoint in kinds)


def cache_affine(endpoint: str) -> bool:
    return endpoint in CACHE_AFFINE
