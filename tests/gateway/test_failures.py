"""Engines that die: retries before the first byte, clean SSE errors after it, releases."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from tests.fixtures.gateway import running_gateway
from tests.gateway._engines import engines

ADMIN = {"Authorization": "Bearer adm"}


def config(urls: list[str], **flags: bool) -> dict[str, Any]:
    return {
        "nodes": [{"id": f"e{i}", "url": u} for i, u in enumerate(urls)],
        "routing": {"scrape_interval_s": 0.5},
        "auth": {"admin_token": "adm"},
        "flags": flags,
    }


def body(i: int, *, stream: bool = False, max_tokens: int = 4) -> dict[str, Any]:
    return {
        "model": "sim",
        "stream": stream,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": f"hello number {i}"}],
    }


async def inflight_total(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(url + "/admin/summary", headers=ADMIN) as r:
        summary = await r.json()
    return sum(n["inflight_requests"] or 0 for n in summary["nodes"])


async def test_killed_engine_loses_no_unary_request() -> None:
    with engines(3) as started:
        async with (
            running_gateway(config([e.url for e in started])) as gw,
            aiohttp.ClientSession() as s,
        ):
            started[0].kill()
            statuses = []
            for i in range(12):
                async with s.post(gw.url + "/v1/chat/completions", json=body(i)) as r:
                    statuses.append(r.status)
                    assert r.headers["X-KVGate-Node"] != "e0"
            assert statuses == [200] * 12
            async with s.get(gw.url + "/metrics") as r:
                text = await r.text()
            assert "kvgate_retries_total" in text


async def test_retries_flag_off_gives_502_at_once() -> None:
    with engines(2) as started:
        urls = [e.url for e in started]
        async with running_gateway(config(urls, retries=False)) as gw, aiohttp.ClientSession() as s:
            started[0].kill()
            started[1].kill()
            async with s.post(gw.url + "/v1/chat/completions", json=body(1)) as r:
                assert r.status == 502
                error = (await r.json())["error"]
                assert "1 attempt" in error["message"]


async def test_engine_death_mid_stream_ends_with_sse_error() -> None:
    with engines(1) as started:
        async with running_gateway(config([started[0].url])) as gw, aiohttp.ClientSession() as s:
            async with s.post(
                gw.url + "/v1/chat/completions", json=body(1, stream=True, max_tokens=4000)
            ) as r:
                assert r.status == 200
                first = await r.content.readuntil(b"\n\n")
                assert first.startswith(b"data: ")
                started[0].kill()
                rest = await r.content.read()
            assert b'data: {"error": ' in rest
            assert rest.rstrip().endswith(b"data: [DONE]")
            assert await inflight_total(s, gw.url) == 0


async def test_client_disconnect_mid_stream_releases_everything() -> None:
    with engines(1) as started:
        async with running_gateway(config([started[0].url])) as gw:
            async with (
                aiohttp.ClientSession() as s,
                s.post(
                    gw.url + "/v1/chat/completions", json=body(1, stream=True, max_tokens=4000)
                ) as r,
            ):
                await r.content.readuntil(b"\n\n")
            # the client session is closed: the gateway notices at its next write
            registry = gw.gateway.registry
            for _ in range(200):
                if registry.get_sample_value("kvgate_inflight_requests") == 0:
                    break
                await asyncio.sleep(0.02)
            assert registry.get_sample_value("kvgate_inflight_requests") == 0
            assert registry.get_sample_value("kvgate_client_disconnects_total") == 1
            async with aiohttp.ClientSession() as s:
                assert await inflight_total(s, gw.url) == 0
            assert not gw.gateway.admission.snapshot().get("used")
