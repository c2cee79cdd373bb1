"""Over-quota work: 429 + Retry-After, the async job path, the economy pool, degrade off."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from tests.fixtures.gateway import running_gateway
from tests.gateway._engines import engines

KEY = {"Authorization": "Bearer k-acme"}
HOLD_TOKENS = 4000  # a long stream that keeps the tenant at its cap while we probe


def config(urls: list[str], mode: str) -> dict[str, Any]:
    return {
        "nodes": [
            {"id": "main", "url": urls[0]},
            {"id": "cheap", "url": urls[1], "pool": "economy"},
        ],
        "routing": {"scrape_interval_s": 0.5},
        "auth": {"admin_token": "adm"},
        "admission": {
            "total_quota": 20000,
            "tenants": [{"name": "acme", "api_keys": ["k-acme"], "hard_cap": HOLD_TOKENS + 200}],
            "queue": {"max_queue_tokens": 0},  # no queue: over quota is refused at once
            "degrade": {"modes": {"batch": mode}},
        },
    }


def body(max_tokens: int, *, stream: bool = False) -> dict[str, Any]:
    return {
        "model": "sim",
        "max_tokens": max_tokens,
        "stream": stream,
        "ignore_eos": True,  # the simulated engine generates exactly max_tokens
        "messages": [{"role": "user", "content": "tell me a long story"}],
    }


@pytest.fixture(scope="module")
def two_engines():
    with engines(2, separate=False) as started:
        yield [e.url for e in started]


async def hold_quota(s: aiohttp.ClientSession, url: str) -> aiohttp.ClientResponse:
    """Start a long stream that reserves most of the tenant's cap; read its first event."""
    r = await s.post(url + "/v1/chat/completions", json=body(HOLD_TOKENS, stream=True), headers=KEY)
    assert r.status == 200, await r.text()
    assert r.headers["X-KVGate-Node"] == "main"
    await r.content.readuntil(b"\n\n")
    return r


async def test_over_quota_interactive_is_429_and_batch_goes_async(two_engines) -> None:
    async with running_gateway(config(two_engines, "async")) as gw, aiohttp.ClientSession() as s:
        holder = await hold_quota(s, gw.url)
        async with s.post(gw.url + "/v1/chat/completions", json=body(400), headers=KEY) as r:
            assert r.status == 429
            assert int(r.headers["Retry-After"]) >= 1
            error = (await r.json())["error"]
            assert error["type"] == "rate_limit_error"
            assert r.headers["X-KVGate-Admission"].startswith("reject")
        headers = {**KEY, "X-KVGate-Class": "batch"}
        async with s.post(gw.url + "/v1/chat/completions", json=body(400), headers=headers) as r:
            assert r.status == 202, await r.text()
            assert "degrade=async" in r.headers["X-KVGate-Admission"]
            location = r.headers["Location"]
        holder.close()  # the client goes away: its reservation is released
        for _ in range(300):
            async with s.get(gw.url + location, headers=KEY) as r:
                if r.status != 202:
                    break
            await asyncio.sleep(0.02)
        assert r.status == 200
        async with s.get(gw.url + location, headers=KEY) as r:
            assert (await r.json())["choices"][0]["message"]["content"]
        # degrade off: the same batch request is refused instead
        async with s.post(
            gw.url + "/admin/flags",
            json={"degrade": False},
            headers={"Authorization": "Bearer adm"},
        ) as r:
            assert r.status == 200
        holder = await hold_quota(s, gw.url)
        async with s.post(gw.url + "/v1/chat/completions", json=body(400), headers=headers) as r:
            assert r.status == 429
        holder.close()


async def test_economy_pool_degrade_routes_to_the_economy_node(two_engines) -> None:
    async with (
        running_gateway(config(two_engines, "economy_pool")) as gw,
        aiohttp.ClientSession() as s,
    ):
        holder = await hold_quota(s, gw.url)
        headers = {**KEY, "X-KVGate-Class": "batch"}
        async with s.post(gw.url + "/v1/chat/completions", json=body(400), headers=headers) as r:
            assert r.status == 200, await r.text()
            assert r.headers["X-KVGate-Node"] == "cheap"
            assert "degrade=economy_pool" in r.headers["X-KVGate-Admission"]
        holder.close()


async def test_queued_request_times_out_with_408(two_engines) -> None:
    cfg = config(two_engines, "async")
    cfg["admission"]["queue"] = {"default_deadline_s": 0.3}
    async with running_gateway(cfg) as gw, aiohttp.ClientSession() as s:
        holder = await hold_quota(s, gw.url)
        async with s.post(gw.url + "/v1/chat/completions", json=body(400), headers=KEY) as r:
            assert r.status == 408
            assert (await r.json())["error"]["type"] == "timeout_error"
            assert "reason=deadline" in r.headers["X-KVGate-Admission"]
        # a queued request is admitted as soon as the holder's tokens come back
        waiting = asyncio.create_task(
            s.post(gw.url + "/v1/chat/completions", json=body(400), headers=KEY)
        )
        await asyncio.sleep(0.05)
        holder.close()
        async with await waiting as r:
            assert r.status == 200
            assert r.headers["X-KVGate-Admission"].startswith("admit")
            assert "queued_ms=0" not in r.headers["X-KVGate-Admission"]
