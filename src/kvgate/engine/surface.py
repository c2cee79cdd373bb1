"""Engine-sim's non-generation OpenAI endpoints.

Token ids are the UTF-8 bytes of each text-model piece read as one integer (behind a 0x01
byte), so every engine instance maps text to the same ids and ``/detokenize`` inverts
``/tokenize`` without a vocabulary. Embeddings are deterministic unit vectors built from
those ids; rerank and score are cosine similarities of the embeddings. The stateful
Responses API (``kvgate.engine.responses``) is mounted through ``Surface.wrap`` too.
"""

from __future__ import annotations

import math
import time
import uuid
from typing import Any, Protocol

import xxhash
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from kvgate.engine.http_errors import error_response
from kvgate.engine.outputs import OutputPlan
from kvgate.engine.profiles import Profile
from kvgate.tokens import tokenize

DEFAULT_DIMENSIONS = 64


class SurfaceError(Exception):
    def __init__(self, message: str, param: str | None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code


def token_ids(text: str) -> list[int]:
    """The text model's pieces as reversible integer ids."""
    return [int.from_bytes(b"\x01" + p.encode()) for p in tokenize(text)]


def detokenize(ids: list[int]) -> str:
    out: list[str] = []
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int) or i < 256:
            raise SurfaceError(f"token id {i!r} is not a token of this model", "tokens")
        raw = i.to_bytes((i.bit_length() + 7) // 8)
        if raw[0] != 1:
            raise SurfaceError(f"token id {i} is not a token of this model", "tokens")
        try:
            out.append(raw[1:].decode())
        except UnicodeDecodeError:
            raise SurfaceError(f"token id {i} is not a token of this model", "tokens") from None
    return "".join(out)


def embed(ids: list[int], dimensions: int) -> list[float]:
    """A unit vector: the sum over tokens of a pseudo-random ±1 vector seeded by the id."""
    vec = [0.0] * dimensions
    for tid in ids:
        seed = tid & 0xFFFFFFFFFFFFFFFF
        for d in range(dimensions):
            h = xxhash.xxh3_64_intdigest(d.to_bytes(4), seed)
            vec[d] += 1.0 if h & 1 else -1.0
    norm = math.sqrt(sum(v * v for v in vec)) or 1.0
    return [v / norm for v in vec]


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def _texts(value: Any, param: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return list(value)
    raise SurfaceError(f"{param} must be a string or a non-empty list of strings", param)


class SurfaceHost(Protocol):
    """What the extra routes need of the engine server that mounts them."""

    model_name: str
    registry: CollectorRegistry
    profile: Profile
    _failed: tuple[int, str] | None

    async def _read_body(self, request: web.Request) -> dict[str, Any]: ...

    def submit(self, request_id: str, text_pieces: list[str], plan: OutputPlan) -> Any: ...

    def release(self, request_id: str, *, abort: bool) -> None: ...

    def _on_event(self, pending: Any, ev: Any) -> None: ...

    def _usage(self, pending: Any) -> dict[str, Any]: ...


class Surface:
    """The extra routes of one ``EngineServer``."""

    def __init__(self, server: SurfaceHost) -> None:
        self.server = server
        labels = ["model_name", "endpoint"]
        self._requests = Counter(
            "kvgate_engine_sim_surface_requests",
            "Non-generation requests served, by endpoint",
            labels,
            registry=server.registry,
        )
        self._tokens = Counter(
            "kvgate_engine_sim_surface_input_tokens",
            "Input tokens of non-generation requests, by endpoint",
            labels,
            registry=server.registry,
        )

    def _note(self, endpoint: str, tokens: int) -> None:
        self._requests.labels(self.server.model_name, endpoint).inc()
        self._tokens.labels(self.server.model_name, endpoint).inc(tokens)

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/embeddings", self.wrap(self.embeddings))
        app.router.add_post("/v1/rerank", self.wrap(self.rerank))
        app.router.add_post("/rerank", self.wrap(self.rerank))
        app.router.add_post("/v2/rerank", self.wrap(self.rerank))
        app.router.add_post("/v1/score", self.wrap(self.score))
        app.router.add_post("/score", self.wrap(self.score))
        app.router.add_post("/tokenize", self.wrap(self.tokenize))
        app.router.add_post("/detokenize", self.wrap(self.detokenize))

    def wrap(self, fn: Any) -> Any:
        async def handler(request: web.Request) -> web.StreamResponse:
            try:
                body: dict[str, Any] = {}
                if request.method == "POST":
                    body = await self.server._read_body(request)
                    self._check_model(body)
                result: web.StreamResponse = await fn(request, body)
                return result
            except SurfaceError as exc:
                return error_response(exc.status, exc.message, exc.param, exc.code)
            except Exception as exc:  # RequestError from the server's body reader
                if hasattr(exc, "status") and hasattr(exc, "message"):
                    return error_response(exc.status, exc.message, getattr(exc, "param", None))
                raise

        return handler

    def _check_model(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        if model is not None and model != self.server.model_name:
            raise SurfaceError(
                f"The model `{model}` does not exist.", "model", 404, "model_not_found"
            )

    def _limit(self, n: int, param: str) -> None:
        limit = self.server.profile.max_model_len
        if n > limit:
            raise SurfaceError(
                f"This model's maximum context length is {limit} tokens. However, your "
                f"request has {n} input tokens.",
                param,
                code="context_length_exceeded",
            )

    async def embeddings(self, request: web.Request, body: dict[str, Any]) -> web.Response:
        if "input" not in body:
            raise SurfaceError("input is required", "input")
        dims = body.get("dimensions") or DEFAULT_DIMENSIONS
        if isinstance(dims, bool) or not isinstance(dims, int) or not 1 <= dims <= 4096:
            raise SurfaceError("dimensions must be an integer in [1, 4096]", "dimensions")
        raw = body["input"]
        id_lists: list[list[int]]
        if isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw):
            id_lists = [list(raw)]
        elif isinstance(raw, list) and raw and all(isinstance(t, list) for t in raw):
            id_lists = [list(t) for t in raw]
        else:
            id_lists = [token_ids(t) for t in _texts(raw, "input")]
        total = 0
        data = []
        for i, ids in enumerate(id_lists):
            self._limit(len(ids), "input")
            total += len(ids)
            data.append({"object": "embedding", "index": i, "embedding": embed(ids, dims)})
        self._note("embeddings", total)
        return web.json_response(
            {
                "object": "list",
                "data": data,
                "model": self.server.model_name,
                "usage": {"prompt_tokens": total, "total_tokens": total},
            }
        )

    async def rerank(self, request: web.Request, body: dict[str, Any]) -> web.Response:
        query = body.get("query")
        if not isinstance(query, str):
            raise SurfaceError("query must be a string", "query")
        docs_raw = body.get("documents")
        if isinstance(docs_raw, list) and all(isinstance(d, dict) for d in docs_raw):
            docs_raw = [d.get("text") for d in docs_raw]
        docs = _texts(docs_raw, "documents")
        top_n = body.get("top_n") or len(docs)
        if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1:
            raise SurfaceError("top_n must be a positive integer", "top_n")
        q_ids = token_ids(query)
        q = embed(q_ids, DEFAULT_DIMENSIONS)
        total = 0
        results = []
        for i, doc in enumerate(docs):
            d_ids = token_ids(doc)
            self._limit(len(q_ids) + len(d_ids), "documents")
            total += len(q_ids) + len(d_ids)
            score = cosine(q, embed(d_ids, DEFAULT_DIMENSIONS))
            results.append({"index": i, "document": {"text": doc}, "relevance_score": score})
        results.sort(key=lambda r: (-float(r["relevance_score"]), int(r["index"])))  # type: ignore[call-overload,arg-type]
        self._note("rerank", total)
        return web.json_response(
            {
                "id": "rerank-" + uuid.uuid4().hex,
                "model": self.server.model_name,
                "usage": {"total_tokens": total},
                "results": results[:top_n],
            }
        )

    async def score(self, request: web.Request, body: dict[str, Any]) -> web.Response:
        first = _texts(body.get("text_1"), "text_1")
        second = _texts(body.get("text_2"), "text_2")
        if len(first) == 1:
            first = first * len(second)
        if len(first) != len(second):
            raise SurfaceError("text_1 and text_2 must have the same length", "text_2")
        total = 0
        data = []
        for i, (a, b) in enumerate(zip(first, second, strict=True)):
            a_ids, b_ids = token_ids(a), token_ids(b)
            self._limit(len(a_ids) + len(b_ids), "text_2")
            total += len(a_ids) + len(b_ids)
            s = cosine(embed(a_ids, DEFAULT_DIMENSIONS), embed(b_ids, DEFAULT_DIMENSIONS))
            data.append({"index": i, "object": "score", "score": s})
        self._note("score", total)
        return web.json_response(
            {
                "id": "score-" + uuid.uuid4().hex,
                "object": "list",
                "created": int(time.time()),
                "model": self.server.model_name,
                "data": data,
                "usage": {"prompt_tokens": total, "total_tokens": total},
            }
        )

    async def tokenize(self, request: web.Request, body: dict[str, Any]) -> web.Response:
        from kvgate.prompts import PromptError, render_chat

        if "messages" in body:
            try:
                text = render_chat(body["messages"], body.get("tools"))
            except PromptError as exc:
                raise SurfaceError(str(exc), "messages") from None
        elif isinstance(body.get("prompt"), str):
            text = body["prompt"]
        else:
            raise SurfaceError("prompt (a string) or messages is required", "prompt")
        ids = token_ids(text)
        self._note("tokenize", len(ids))
        return web.json_response(
            {"count": len(ids), "max_model_len": self.server.profile.max_model_len, "tokens": ids}
        )

    async def detokenize(self, request: web.Request, body: dict[str, Any]) -> web.Response:
        ids = body.get("tokens")
        if not isinstance(ids, list):
            raise SurfaceError("tokens must be a list of integers", "tokens")
        text = detokenize(ids)
        self._note("detokenize", len(ids))
        return web.json_response({"prompt": text})
