"""Engines that die: retries before the first byte, clean SSE errors after it, releases."""

from __future__ import annotations

import asyncio
import time
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
    # ignore_eos: the simulated engine generates exactly max_tokens (a long, busy request)
    return {"model": "sim", "stream": stream, "max_tokens": max_tokens, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"hello number {i}"}]}  # fmt: skip


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

            async def one(i: int) -> tuple[int, str, float]:
                async with s.post(
                    gw.url + "/v1/chat/completions", json=body(i, max_tokens=300)
                ) as r:
                    await r.read()
                    return r.status, r.headers.get("X-KVGate-Node", ""), time.monotonic()

            # requests in flight on every node when e0 dies: those on e0 are retried
            tasks = [asyncio.create_task(one(i)) for i in range(12)]
            e0 = gw.gateway.nodes.get("e0")
            while e0.inflight_requests == 0:
                await asyncio.sleep(0.005)
            started[0].kill()
            killed_at = time.monotonic()
            results = await asyncio.gather(*tasks)
            assert [status for status, _, _ in results] == [200] * 12
            # an answer from e0 can only be one it finished before it died
            assert all(node != "e0" or done < killed_at for _, node, done in results)
            # and requests sent after the death never fail either
            for i in range(6):
                status, node, _ = await one(100 + i)
                assert status == 200 and node != "e0"
            retries = sum(
                gw.gateway.registry.get_sample_value("kvgate_retries_total", {"cause": c}) or 0
                for c in ("connect", "disconnected", "read", "http_5xx")
            )
            assert retries >= 1


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
