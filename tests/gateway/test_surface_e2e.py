"""Embeddings, rerank, score, tokenize and detokenize through a real ``kvgate serve``
process in front of real ``kvgate engine-sim`` processes: tenant auth, admission (the
decisions counter), least-load routing, the X-KVGate headers and OpenAI-style errors."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import aiohttp
import openai
import pytest

from tests.fixtures.gateway import GatewayProcess, running_gateway, start_gateway_process
from tests.gateway._engines import MODEL, Engine, engines

KEY = "k-acme"
NODES = ("e0", "e1")


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[GatewayProcess, list[Engine]]]:
    with engines(2, separate=False) as started:
        config = {
            "nodes": [{"id": n, "url": e.url} for n, e in zip(NODES, started, strict=True)],
            "admission": {
                "total_quota": 20000,
                "tenants": [{"name": "acme", "api_keys": [KEY]}],
            },
        }
        gw = start_gateway_process(config=config)
        try:
            yield gw, started
        finally:
            gw.stop()


@pytest.fixture
def gw(cluster: tuple[GatewayProcess, list[Engine]]) -> GatewayProcess:
    return cluster[0]


def _auth(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _post(url: str, body: dict[str, Any], key: str | None = KEY) -> tuple[int, Any, Any]:
    headers = _auth(key) if key is not None else {}
    timeout = aiohttp.ClientTimeout(total=60)
    async with (
        aiohttp.ClientSession(timeout=timeout) as s,
        s.post(url, json=body, headers=headers) as r,
    ):
        return r.status, await r.json(content_type=None), r.headers


async def _admitted(url: str) -> float:
    """kvgate_admission_decisions_total for tenant acme, decision admit (all reasons)."""
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        text = await r.text()
    total = 0.0
    for line in text.splitlines():
        if (
            line.startswith("kvgate_admission_decisions_total{")
            and 'tenant="acme"' in line
            and 'decision="admit"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _check_headers(headers: Any) -> None:
    assert headers["X-KVGate-Node"] in NODES
    assert headers["X-KVGate-Route-Reason"] == "least_load"
    assert headers["X-KVGate-Admission"].startswith("admit")
    assert headers["X-KVGate-Expected-Cached-Tokens"] == "0"
    assert headers["X-Request-Id"]


async def test_openai_sdk_embeddings_through_the_gateway(gw: GatewayProcess) -> None:
    before = await _admitted(gw.url)
    client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=KEY, timeout=60)
    raw = await client.embeddings.with_raw_response.create(
        model=MODEL, input=["hello world", "other text"], encoding_format="float"
    )
    result = raw.parse()
    _check_headers(raw.headers)
    assert [d.index for d in result.data] == [0, 1]
    v0, v1 = result.data[0].embedding, result.data[1].embedding
    assert len(v0) == 64 and v0 != v1
    assert math.isclose(sum(x * x for x in v0), 1.0, rel_tol=1e-9)
    assert result.usage.prompt_tokens == 4
    # an embedding reserves its input tokens and no decode
    fields = dict(f.split("=", 1) for f in raw.headers["X-KVGate-Admission"].split("; ")[1:])
    assert fields["reserved"] == "4", raw.headers["X-KVGate-Admission"]
    # deterministic across engines: the same vector whichever node answers
    again = await client.embeddings.create(model=MODEL, input="hello world")
    assert again.data[0].embedding == v0
    assert await _admitted(gw.url) == before + 2  # admission decided both requests
    with pytest.raises(openai.AuthenticationError):
        await openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="wrong").embeddings.create(
            model=MODEL, input="x"
        )
    with pytest.raises(openai.NotFoundError) as missing:
        await client.embeddings.create(model="no-such-model", input="x")
    assert missing.value.status_code == 404
    body = missing.value.body
    assert isinstance(body, dict) and body.get("code") == "model_not_found"


async def test_embeddings_spread_by_least_load(gw: GatewayProcess) -> None:
    seen = set()
    for i in range(24):
        status, _, headers = await _post(gw.url + "/v1/embeddings", {"input": f"text {i}"})
        assert status == 200
        seen.add(headers["X-KVGate-Node"])
    assert seen == set(NODES)  # no cache affinity: idle nodes tie and both are used


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v2/rerank"])
async def test_rerank(gw: GatewayProcess, path: str) -> None:
    body = {
        "model": MODEL,
        "query": "red apples",
        "documents": ["green pears", "red apples and more red apples", "blue sky"],
        "top_n": 2,
    }
    status, out, headers = await _post(gw.url + path, body)
    assert status == 200, out
    _check_headers(headers)
    assert len(out["results"]) == 2
    assert out["results"][0]["index"] == 1
    scores = [r["relevance_score"] for r in out["results"]]
    assert scores == sorted(scores, reverse=True)
    status, _, _ = await _post(gw.url + path, body, key=None)
    assert status == 401


async def test_score(gw: GatewayProcess) -> None:
    body = {"model": MODEL, "text_1": "a cat sat", "text_2": ["a cat sat", "stock prices"]}
    status, out, headers = await _post(gw.url + "/v1/score", body)
    assert status == 200, out
    _check_headers(headers)
    assert [d["index"] for d in out["data"]] == [0, 1]
    assert math.isclose(out["data"][0]["score"], 1.0, rel_tol=1e-9)
    assert out["data"][1]["score"] < out["data"][0]["score"]


async def test_tokenize_detokenize_round_trip(gw: GatewayProcess) -> None:
    text = "The quick brown fox, 123 times!"
    before = await _admitted(gw.url)
    status, tok, headers = await _post(gw.url + "/tokenize", {"model": MODEL, "prompt": text})
    assert status == 200, tok
    _check_headers(headers)
    assert tok["count"] == len(tok["tokens"]) > 5
    status, out, headers = await _post(gw.url + "/detokenize", {"tokens": tok["tokens"]})
    assert status == 200, out
    _check_headers(headers)
    assert out["prompt"] == text
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    status, tok, _ = await _post(gw.url + "/tokenize", chat)
    assert status == 200 and tok["count"] > 1
    assert await _admitted(gw.url) == before + 3
    status, _, _ = await _post(gw.url + "/tokenize", {"prompt": text}, key=None)
    assert status == 401


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/embeddings", {"model": MODEL}, "input"),
        ("/v1/embeddings", {"model": MODEL, "input": 5}, "input"),
        ("/v1/rerank", {"model": MODEL, "query": "q"}, "documents"),
        ("/v1/rerank", {"model": MODEL, "query": "q", "documents": [3]}, "documents[0]"),
        ("/v1/score", {"text_1": "a", "text_2": ["b", "c"], "stream": True}, "stream"),
        ("/v1/score", {"text_1": ["a", "b"], "text_2": ["b", "c", "d"]}, "text_2"),
        ("/tokenize", {"prompt": 7}, "prompt"),
        ("/detokenize", {"tokens": ["x"]}, "tokens"),
    ],
)
async def test_bad_bodies_are_400_naming_the_field(
    gw: GatewayProcess, path: str, body: dict[str, Any], param: str
) -> None:
    status, out, _ = await _post(gw.url + path, body)
    assert status == 400, out
    assert out["error"]["param"] == param
    assert out["error"]["type"] == "invalid_request_error"


async def test_unknown_model_is_an_openai_404(gw: GatewayProcess) -> None:
    for path, body in [
        ("/v1/rerank", {"query": "q", "documents": ["d"]}),
        ("/tokenize", {"prompt": "x"}),
        ("/v1/score", {"text_1": "a", "text_2": "b"}),
    ]:
        status, out, _ = await _post(gw.url + path, {**body, "model": "nope"})
        assert status == 404, out
        assert out["error"]["code"] == "model_not_found"
        assert out["error"]["param"] == "model"
        assert "nope" in out["error"]["message"]


async def test_an_endpoint_no_node_serves_is_a_404_naming_it(
    cluster: tuple[GatewayProcess, list[Engine]],
) -> None:
    engine = cluster[1][0]
    config = {"nodes": [{"id": "t0", "url": engine.url, "engine_type": "tgi", "model": MODEL}]}
    async with running_gateway(config) as gw:
        status, out, _ = await _post(gw.url + "/v1/embeddings", {"input": "x"}, key=None)
        assert status == 404, out
        assert out["error"]["code"] == "endpoint_not_served"
        assert "/v1/embeddings" in out["error"]["message"]
