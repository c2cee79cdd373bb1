"""Engine-sim's embeddings, rerank, score, tokenize and stateful responses endpoints."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest
from aiohttp import web

from kvgate.engine.profiles import get_profile
from kvgate.engine.server import EngineServer


async def _serve(server: EngineServer) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(server.make_app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture
async def two() -> AsyncIterator[tuple[str, str]]:
    a = await _serve(EngineServer(get_profile("gemma3-270m-cpu"), time_scale=50.0))
    b = await _serve(EngineServer(get_profile("gemma3-270m-cpu"), time_scale=50.0))
    try:
        yield a[1], b[1]
    finally:
        await a[0].cleanup()
        await b[0].cleanup()


async def test_embeddings_are_deterministic_unit_vectors_across_instances(
    two: tuple[str, str],
) -> None:
    ca = openai.AsyncOpenAI(base_url=two[0] + "/v1", api_key="x", timeout=60)
    cb = openai.AsyncOpenAI(base_url=two[1] + "/v1", api_key="x", timeout=60)
    model = (await ca.models.list()).data[0].id
    ra = await ca.embeddings.create(model=model, input=["hello world", "other text"])
    rb = await cb.embeddings.create(model=model, input="hello world")
    v0, v1 = ra.data[0].embedding, ra.data[1].embedding
    assert v0 == rb.data[0].embedding
    assert v0 != v1
    assert math.isclose(sum(x * x for x in v0), 1.0, rel_tol=1e-9)
    assert ra.usage.prompt_tokens == 4  # "hello", " world", "other", " text"
    with pytest.raises(openai.NotFoundError):
        await ca.embeddings.create(model="no-such-model", input="x")


async def test_tokenize_round_trips_and_rerank_orders_by_similarity(two: tuple[str, str]) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        text = "The quick brown fox, 123 times!"
        async with s.post(two[0] + "/tokenize", json={"prompt": text}) as r:
            tok = await r.json()
        assert tok["count"] == len(tok["tokens"]) > 5
        async with s.post(two[1] + "/detokenize", json={"tokens": tok["tokens"]}) as r:
            assert (await r.json())["prompt"] == text
        async with s.post(two[1] + "/detokenize", json={"tokens": [7]}) as r:
            assert r.status == 400 and (await r.json())["error"]["param"] == "tokens"
        docs = ["cats and dogs", "red fox jumps", "red fox jumps high"]
        body = {"query": "red fox jumps", "documents": docs, "top_n": 2}
        async with s.post(two[0] + "/v1/rerank", json=body) as r:
            rr = await r.json()
        assert [x["index"] for x in rr["results"]] == [1, 2]
        assert math.isclose(rr["results"][0]["relevance_score"], 1.0)
        body2 = {"text_1": "red fox", "text_2": ["red fox", "blue whale"]}
        async with s.post(two[0] + "/v1/score", json=body2) as r:
            sc = await r.json()
        assert sc["data"][0]["score"] > sc["data"][1]["score"]


async def test_responses_are_stateful_per_instance(two: tuple[str, str]) -> None:
    ca = openai.AsyncOpenAI(base_url=two[0] + "/v1", api_key="x", timeout=60)
    cb = openai.AsyncOpenAI(base_url=two[1] + "/v1", api_key="x", timeout=60)
    model = (await ca.models.list()).data[0].id
    first = await ca.responses.create(model=model, input="Tell me a story", max_output_tokens=8)
    assert first.id.startswith("resp_") and first.output_text
    second = await ca.responses.create(
        model=model,
        input="And then?",
        previous_response_id=first.id,
        max_output_tokens=8,
    )
    assert second.usage is not None and first.usage is not None
    # The follow-up carries the first turn: more input tokens, the first turn's blocks cached.
    assert second.usage.input_tokens > first.usage.input_tokens
    with pytest.raises(openai.NotFoundError) as err:
        await cb.responses.create(model=model, input="And then?", previous_response_id=first.id)
    assert "not found" in str(err.value)


async def test_streamed_response_is_stored_and_continued(two: tuple[str, str]) -> None:
    ca = openai.AsyncOpenAI(base_url=two[0] + "/v1", api_key="x", timeout=60)
    model = (await ca.models.list()).data[0].id
    kinds: list[str] = []
    deltas: list[str] = []
    completed = None
    stream = await ca.responses.create(
        model=model, input="Tell me a story", instructions="Be brief.", max_output_tokens=8,
        stream=True,
    )  # fmt: skip
    async for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        if event.type == "response.completed":
            completed = event.response
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert completed is not None and completed.status == "completed"
    assert completed.output_text == "".join(deltas) and deltas
    assert completed.usage is not None and completed.usage.output_tokens == len(deltas)
    got = await ca.responses.retrieve(completed.id)
    assert got.id == completed.id and got.output_text == completed.output_text
    follow = await ca.responses.create(
        model=model, input="And then?", previous_response_id=completed.id, max_output_tokens=4
    )
    assert follow.previous_response_id == completed.id
    assert follow.usage is not None
    assert follow.usage.input_tokens > completed.usage.input_tokens + completed.usage.output_tokens
    # the stored conversation is in the prefix cache: its blocks are hits
    assert follow.usage.input_tokens_details.cached_tokens > 0
    with pytest.raises(openai.BadRequestError):
        await ca.responses.create(model=model, input=[])
