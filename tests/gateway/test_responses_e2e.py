"""``POST /v1/responses`` through two real ``kvgate serve`` replicas sharing a real Redis,
in front of three real engine-sims (each in its own process): the OpenAI SDK's
``responses.create`` with and without ``previous_response_id``, streamed and not. A
follow-up sent to the OTHER replica lands on the engine holding the response (each
engine-sim keeps its responses to itself, as vLLM does: any other engine answers 404);
a removed or dead holder is a 404 ``previous_response_not_found``; unknown ids, models and
endpoints are 404s with the OpenAI body."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import aiohttp
import openai
import pytest

from tests.fixtures.gateway import GatewayProcess, start_gateway_process
from tests.gateway._engines import MODEL, Engine, engines

KEY = "k-acme"
ADMIN = "admin-secret"
NODES = ("e0", "e1", "e2")


@pytest.fixture(scope="module")
def cluster(
    module_redis_server: Any,
) -> Iterator[tuple[GatewayProcess, GatewayProcess, list[Engine]]]:
    with engines(len(NODES)) as started:
        config = {
            "nodes": [
                {"id": n, "url": e.url, "engine_type": "sim"}
                for n, e in zip(NODES, started, strict=True)
            ],
            "store": module_redis_server.url,
            "admission": {"total_quota": 50000, "tenants": [{"name": "acme", "api_keys": [KEY]}]},
            "auth": {"admin_token": ADMIN},
            "routing": {"scrape_interval_s": 0.5},
        }
        a = start_gateway_process(config=config)
        try:
            b = start_gateway_process(config=config)
            try:
                yield a, b, started
            finally:
                b.stop()
        finally:
            a.stop()


def _client(gw: GatewayProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=KEY, timeout=60, max_retries=0)


def _reserved(headers: Any) -> int:
    fields = dict(f.split("=", 1) for f in headers["X-KVGate-Admission"].split("; ")[1:])
    return int(fields["reserved"])


async def _metric(gw: GatewayProcess, name: str, **labels: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(gw.url + "/metrics") as r:
        text = await r.text()
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_follow_up_via_the_other_replica_lands_on_the_holder(
    cluster: tuple[GatewayProcess, GatewayProcess, list[Engine]],
) -> None:
    a, b, _ = cluster
    ca, cb = _client(a), _client(b)
    hits = await _metric(b, "kvgate_response_affinity_lookups_total", result="hit")
    holders = set()
    chains = 6
    for i in range(chains):
        raw = await ca.responses.with_raw_response.create(
            model=MODEL,
            input=f"Story number {i}: tell me about the {i}th dragon",
            instructions=f"You are storyteller number {i}.",
            max_output_tokens=8,
        )
        first = raw.parse()
        node = raw.headers["X-KVGate-Node"]
        holders.add(node)
        assert first.id.startswith("resp_") and first.output_text
        assert raw.headers["X-KVGate-Route-Reason"] != "previous_response"
        raw2 = await cb.responses.with_raw_response.create(
            model=MODEL, input="And then?", previous_response_id=first.id, max_output_tokens=8
        )
        second = raw2.parse()  # any other engine would have answered 404
        assert raw2.headers["X-KVGate-Node"] == node
        assert raw2.headers["X-KVGate-Route-Reason"] == "previous_response"
        assert second.previous_response_id == first.id and second.output_text
        assert first.usage is not None and second.usage is not None
        conversation = first.usage.input_tokens + first.usage.output_tokens
        # admission counts the stored conversation the engine reads again, and the bound
        assert _reserved(raw2.headers) >= conversation + 8
        assert int(raw2.headers["X-KVGate-Expected-Cached-Tokens"]) == conversation // 16 * 16
        assert second.usage.input_tokens_details.cached_tokens >= conversation // 16 * 16
        # a third turn, back through the first replica, continues the second response
        raw3 = await ca.responses.with_raw_response.create(
            model=MODEL, input="The end.", previous_response_id=second.id, max_output_tokens=4
        )
        assert raw3.headers["X-KVGate-Node"] == node
    # first turns with distinct prefixes spread: the pin is what kept each chain together
    assert len(holders) >= 2
    after = await _metric(b, "kvgate_response_affinity_lookups_total", result="hit")
    assert after == hits + chains


async def test_streamed_follow_up_via_the_other_replica(
    cluster: tuple[GatewayProcess, GatewayProcess, list[Engine]],
) -> None:
    a, b, _ = cluster
    ca, cb = _client(a), _client(b)
    async with ca.responses.with_streaming_response.create(
        model=MODEL, input="Stream me a poem", max_output_tokens=12, stream=True
    ) as raw:
        node = raw.headers["X-KVGate-Node"]
        kinds, first_id = [], None
        async for event in await raw.parse():
            kinds.append(event.type)
            if event.type == "response.created":
                first_id = event.response.id
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert first_id is not None
    async with cb.responses.with_streaming_response.create(
        model=MODEL, input="More", previous_response_id=first_id, stream=True, max_output_tokens=6
    ) as raw2:
        assert raw2.headers["X-KVGate-Node"] == node
        assert raw2.headers["X-KVGate-Route-Reason"] == "previous_response"
        deltas, completed = [], None
        async for event in await raw2.parse():
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
            elif event.type == "response.completed":
                completed = event.response
    assert completed is not None and completed.previous_response_id == first_id
    assert deltas and completed.output_text == "".join(deltas)
    # the streamed follow-up is mapped too: a unary third turn via replica A follows it
    raw3 = await ca.responses.with_raw_response.create(
        model=MODEL, input="Fin", previous_response_id=completed.id, max_output_tokens=4
    )
    assert raw3.headers["X-KVGate-Node"] == node


async def test_unknown_ids_models_and_endpoints_are_openai_404s(
    cluster: tuple[GatewayProcess, GatewayProcess, list[Engine]],
) -> None:
    a, b, _ = cluster
    cb = _client(b)
    misses = await _metric(b, "kvgate_response_affinity_lookups_total", result="miss")
    with pytest.raises(openai.NotFoundError) as unknown:
        await cb.responses.create(model=MODEL, input="hi", previous_response_id="resp_nope")
    body = unknown.value.body
    assert isinstance(body, dict) and body.get("code") == "response_not_found"  # the engine's
    assert await _metric(b, "kvgate_response_affinity_lookups_total", result="miss") == misses + 1
    with pytest.raises(openai.NotFoundError) as model:
        await cb.responses.create(model="no-such-model", input="hi")
    body = model.value.body
    assert isinstance(body, dict) and body.get("code") == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        await cb.responses.create(model=MODEL, input=[])
    assert isinstance(bad.value.body, dict) and bad.value.body.get("param") == "input"
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            a.url + "/v1/no-such-endpoint",
            json={"input": "x"},
            headers={"Authorization": f"Bearer {KEY}"},
        ) as r,
    ):
        assert r.status == 404
        error = (await r.json())["error"]
        assert set(error) >= {"message", "type", "code"}
    with pytest.raises(openai.AuthenticationError):
        await openai.AsyncOpenAI(base_url=b.url + "/v1", api_key="wrong").responses.create(
            model=MODEL, input="hi"
        )


async def test_conversation_turns_via_either_replica_stay_on_its_node(
    cluster: tuple[GatewayProcess, GatewayProcess, list[Engine]],
) -> None:
    a, b, _ = cluster
    ca, cb = _client(a), _client(b)
    raw = await ca.conversations.with_raw_response.create(
        items=[{"type": "message", "role": "user", "content": "Let us plan a trip"}]
    )
    conv = raw.parse()
    node = raw.headers["X-KVGate-Node"]
    assert conv.id.startswith("conv_") and raw.headers["X-KVGate-Route-Reason"] == "least_load"
    sizes = []
    for i, client in enumerate((cb, ca, cb)):
        turn = await client.responses.with_raw_response.create(
            model=MODEL, input=f"Day {i}?", conversation=conv.id, max_output_tokens=6
        )
        assert turn.headers["X-KVGate-Node"] == node  # any other engine would answer 404
        assert turn.headers["X-KVGate-Route-Reason"] == "previous_response"
        usage = turn.parse().usage
        assert usage is not None
        sizes.append(usage.input_tokens)
    assert sizes == sorted(sizes) and len(set(sizes)) == 3  # each turn reads the ones before
    with pytest.raises(openai.BadRequestError) as both:
        await cb.responses.create(
            model=MODEL, input="x", conversation=conv.id, previous_response_id="resp_x"
        )
    assert isinstance(both.value.body, dict) and both.value.body.get("param") == "conversation"
    with pytest.raises(openai.NotFoundError) as unknown:
        await cb.responses.create(model=MODEL, input="x", conversation="conv_nope")
    assert isinstance(unknown.value.body, dict)
    assert unknown.value.body.get("code") == "conversation_not_found"  # the engine's


async def _chain_start(client: openai.AsyncOpenAI, text: str) -> tuple[str, str]:
    raw = await client.responses.with_raw_response.create(
        model=MODEL, input=text, max_output_tokens=4
    )
    return raw.parse().id, raw.headers["X-KVGate-Node"]


async def _remove(gw: GatewayProcess, node: str) -> None:
    async with (
        aiohttp.ClientSession() as s,
        s.delete(
            gw.url + f"/admin/nodes/{node}", headers={"Authorization": f"Bearer {ADMIN}"}
        ) as r,
    ):
        assert r.status == 200, await r.text()


async def test_holder_removed_or_dead_is_a_404_naming_it(
    cluster: tuple[GatewayProcess, GatewayProcess, list[Engine]],
) -> None:
    a, b, started = cluster
    ca, cb = _client(a), _client(b)
    # removed: the holder is taken out of replica B's node set
    rid, node = await _chain_start(ca, "A conversation on a node that will be removed")
    await _remove(b, node)
    with pytest.raises(openai.NotFoundError) as removed:
        await cb.responses.create(model=MODEL, input="still there?", previous_response_id=rid)
    body = removed.value.body
    assert isinstance(body, dict) and body.get("code") == "previous_response_not_found"
    assert node in str(body.get("message")) and "removed" in str(body.get("message"))
    assert await _metric(b, "kvgate_response_affinity_node_gone_total", why="removed") == 1
    # dead: the holder's engine process is killed; replica A still lists it
    rid2, node2 = await _chain_start(ca, "A conversation on a node whose engine dies")
    started[NODES.index(node2)].kill()
    with pytest.raises(openai.NotFoundError) as dead:
        await ca.responses.create(model=MODEL, input="hello?", previous_response_id=rid2)
    body = dead.value.body
    assert isinstance(body, dict) and body.get("code") == "previous_response_not_found"
    assert node2 in str(body.get("message"))
    # found dead at once (its attempt could not connect) or, after failed scrapes, unreachable
    name = "kvgate_response_affinity_node_gone_total"
    seen = [await _metric(a, name, why=w) for w in ("unanswered", "unreachable", "ejected")]
    assert sum(seen) == 1, seen
    # a new conversation still works on the nodes left
    fresh = await ca.responses.create(model=MODEL, input="a new start", max_output_tokens=4)
    assert fresh.output_text
