"""Flags turned off (via POST /admin/flags) change behaviour as documented in flags.py.

``retries`` is covered in test_failures.py, ``degrade`` in test_degrade_e2e.py;
``load_guard`` and ``dynamic_quota`` need controlled load and virtual time, so they are
covered by the routing and admission unit tests (tests/routing, tests/admission).
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.fixtures.gateway import running_gateway
from tests.gateway._engines import engines
from tests.gateway.test_routing_e2e import ADMIN, cached, chat, gateway_config


@pytest.fixture(scope="module")
def four_engines():
    with engines(4, separate=False) as started:
        yield started


async def set_flags(s: aiohttp.ClientSession, url: str, **flags: bool) -> None:
    async with s.post(url + "/admin/flags", json=flags, headers=ADMIN) as r:
        assert r.status == 200, await r.text()


async def summary(s: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with s.get(url + "/admin/summary", headers=ADMIN) as r:
        return await r.json()  # type: ignore[no-any-return]


async def test_cache_affinity_off_ignores_the_prefix_index(four_engines) -> None:
    urls = [e.url for e in four_engines]
    async with running_gateway(gateway_config(urls)) as gw, aiohttp.ClientSession() as s:
        await chat(s, gw.url, 400, "a")
        _, headers, _ = await chat(s, gw.url, 400, "b")
        assert headers["X-KVGate-Route-Reason"] == "prefix_match"
        await set_flags(s, gw.url, cache_affinity=False)
        _, headers, _ = await chat(s, gw.url, 400, "c")
        assert headers["X-KVGate-Route-Reason"] != "prefix_match"
        assert headers["X-KVGate-Expected-Cached-Tokens"] == "0"


async def test_consistent_hashing_off_sends_misses_to_least_load(four_engines) -> None:
    urls = [e.url for e in four_engines]
    async with running_gateway(gateway_config(urls)) as gw, aiohttp.ClientSession() as s:
        _, headers, _ = await chat(s, gw.url, 410, "a")
        assert headers["X-KVGate-Route-Reason"] == "home_set"
        await set_flags(s, gw.url, consistent_hashing=False)
        _, headers, _ = await chat(s, gw.url, 411, "a")
        assert headers["X-KVGate-Route-Reason"] == "least_load_miss"


async def test_hit_feedback_off_never_demotes(four_engines) -> None:
    urls = [e.url for e in four_engines]
    async with (
        running_gateway(gateway_config(urls, flags={"hit_feedback": False})) as gw,
        aiohttp.ClientSession() as s,
    ):
        _, headers, _ = await chat(s, gw.url, 430, "a")
        home = headers["X-KVGate-Node"]
        async with s.post(urls[int(home[1:])] + "/reset_prefix_cache") as r:
            assert r.status == 200
        _, headers, body = await chat(s, gw.url, 430, "b")
        assert headers["X-KVGate-Node"] == home
        assert cached(body) < int(headers["X-KVGate-Expected-Cached-Tokens"])
        row = next(n for n in (await summary(s, gw.url))["nodes"] if n["node_id"] == home)
        assert row["demotions"] == 0
        _, headers, _ = await chat(s, gw.url, 430, "c")
        assert headers["X-KVGate-Route-Reason"] == "prefix_match"  # still trusted


async def test_cold_boost_off_gives_new_nodes_no_boost(four_engines) -> None:
    urls = [e.url for e in four_engines]
    async with running_gateway(gateway_config(urls)) as gw, aiohttp.ClientSession() as s:
        boosts = [n["cold_boost"] for n in (await summary(s, gw.url))["nodes"]]
        assert all(b > 0 for b in boosts), boosts  # every node is new, so warming up
        await set_flags(s, gw.url, cold_boost=False)
        boosts = [n["cold_boost"] for n in (await summary(s, gw.url))["nodes"]]
        assert boosts == [0, 0, 0, 0]


async def test_admission_off_admits_everything(four_engines) -> None:
    urls = [e.url for e in four_engines]
    tight = {"total_quota": 64}  # smaller than any request here: all would be refused
    async with (
        running_gateway(gateway_config(urls, admission=tight)) as gw,
        aiohttp.ClientSession() as s,
    ):
        status, _, _ = await chat(s, gw.url, 440, "a")
        assert status in (413, 429)
        await set_flags(s, gw.url, admission=False)
        status, headers, _ = await chat(s, gw.url, 440, "b")
        assert status == 200
        assert "reason=admission_off" in headers["X-KVGate-Admission"]
