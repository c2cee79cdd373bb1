"""Over-quota work: 429 + Retry-After, the async job path, the economy pool, degrade off.

Degraded work reserves like anything else: async jobs wait in the admission queue, and
economy-pool work may pass its fair share, never its hard cap.
"""

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
            "tenants": [
                {
                    "name": "acme",
                    "api_keys": ["k-acme"],
                    "hard_cap": HOLD_TOKENS + 200,
                    "classes": ["interactive", "batch"],
                }
            ],
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
    cfg = config(two_engines, "async")
    # interactive work may not wait; async work waits in the queue for its turn
    cfg["admission"]["queue"] = {
        "max_queue_tokens": 1000,
        "class_deadlines_s": {"interactive": 0, "batch": 0},
    }
    async with running_gateway(cfg) as gw, aiohttp.ClientSession() as s:
        holder = await hold_quota(s, gw.url)
        async with s.post(gw.url + "/v1/chat/completions", json=body(400), headers=KEY) as r:
            assert r.status == 408
            assert r.headers["X-KVGate-Admission"].startswith("reject")
        headers = {**KEY, "X-KVGate-Class": "batch"}
        async with s.post(gw.url + "/v1/chat/completions", json=body(400), headers=headers) as r:
            assert r.status == 202, await r.text()
            assert "degrade=async" in r.headers["X-KVGate-Admission"]
            location = r.headers["Location"]
        # the job is not dispatched around the quota: it waits while the holder holds
        await asyncio.sleep(0.3)
        async with s.get(gw.url + location, headers=KEY) as r:
            assert r.status == 202
        snapshot = gw.gateway.admission.snapshot()
        assert snapshot["tenants"]["acme"]["queue_depth"] == 1
        assert snapshot["tenants"]["acme"]["used"] <= HOLD_TOKENS + 200
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
        cfg_off = {**headers, "X-KVGate-Priority": "0"}
        async with s.post(gw.url + "/v1/chat/completions", json=body(400), headers=cfg_off) as r:
            assert r.status in (408, 429)
        holder.close()


async def test_a_class_the_key_does_not_allow_is_403(two_engines) -> None:
    cfg = config(two_engines, "async")
    cfg["admission"]["tenants"][0]["classes"] = ["interactive"]
    async with running_gateway(cfg) as gw, aiohttp.ClientSession() as s:
        headers = {**KEY, "X-KVGate-Class": "batch"}
        async with s.post(gw.url + "/v1/chat/completions", json=body(50), headers=headers) as r:
            assert r.status == 403
            error = (await r.json())["error"]
            assert (error["code"], error["param"]) == ("class_not_allowed", "X-KVGate-Class")
            assert "'batch' is not allowed for tenant 'acme'" in error["message"]


async def test_economy_pool_degrade_passes_the_fair_share_not_the_cap(two_engines) -> None:
    cfg = config(two_engines, "economy_pool")
    admission = cfg["admission"]
    admission["total_quota"] = 2 * HOLD_TOKENS + 1000
    admission["tenants"][0]["hard_cap"] = HOLD_TOKENS + 800
    admission["tenants"].append({"name": "zed", "api_keys": ["k-zed"]})
    admission["queue"] = {"max_queue_tokens": 10_000, "default_deadline_s": 30}
    zed = {"Authorization": "Bearer k-zed"}
    async with running_gateway(cfg) as gw, aiohttp.ClientSession() as s:
        holder = await hold_quota(s, gw.url)
        r = await s.post(
            gw.url + "/v1/chat/completions", json=body(HOLD_TOKENS, stream=True), headers=zed
        )
        assert r.status == 200
        await r.content.readuntil(b"\n\n")
        # zed now waits in the queue, so acme is held to half the pool
        waiting = asyncio.create_task(
            s.post(gw.url + "/v1/chat/completions", json=body(1500), headers=zed)
        )
        await asyncio.sleep(0.2)
        headers = {**KEY, "X-KVGate-Class": "batch"}
        async with s.post(gw.url + "/v1/chat/completions", json=body(600), headers=headers) as b:
            assert b.status == 200, await b.text()
            assert b.headers["X-KVGate-Node"] == "cheap"
            assert "degrade=economy_pool" in b.headers["X-KVGate-Admission"]
        # past the hard cap it is not degraded but waits like anything else
        snapshot = gw.gateway.admission.snapshot()
        assert snapshot["tenants"]["acme"]["used"] <= HOLD_TOKENS + 800
        holder.close()
        r.close()
        (await waiting).close()


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
