"""scrape() against real HTTP servers on loopback: good bodies, errors, timeouts, no server."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from kvgate.adapters import get_adapter

SAMPLES = Path(__file__).parent / "samples"


class EngineLike:
    """A real aiohttp server whose /metrics and /slots answers the test sets."""

    def __init__(self) -> None:
        self.metrics_body = (SAMPLES / "vllm.txt").read_text()
        self.metrics_status = 200
        self.slots_body = "[]"
        self.slots_status = 200
        self.delay_s = 0.0
        self.url = ""

    async def metrics(self, _: web.Request) -> web.Response:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return web.Response(text=self.metrics_body, status=self.metrics_status)

    async def slots(self, _: web.Request) -> web.Response:
        return web.Response(
            text=self.slots_body, status=self.slots_status, content_type="application/json"
        )


@pytest.fixture
async def engine() -> AsyncIterator[EngineLike]:
    e = EngineLike()
    app = web.Application()
    app.router.add_get("/metrics", e.metrics)
    app.router.add_get("/slots", e.slots)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    e.url = f"http://127.0.0.1:{port}/"
    yield e
    await runner.cleanup()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_scrape_ok_then_http_error_then_timeout(engine: EngineLike) -> None:
    adapter = get_adapter("vllm")
    async with aiohttp.ClientSession() as session:
        ok = await adapter.scrape(session, engine.url, node_id="a", now=1.0)
        assert not ok.stale and ok.kv_capacity_tokens == 7281 * 16
        engine.metrics_status = 500
        err = await adapter.scrape(session, engine.url, node_id="a", now=2.0, previous=ok)
        assert err.stale and err.extra["prompt_tokens_total"] == 5.0
        engine.metrics_status, engine.delay_s = 200, 1.0
        slow = await adapter.scrape(
            session, engine.url, node_id="a", now=3.0, previous=err, timeout_s=0.2
        )
        assert slow.stale


async def test_scrape_unreachable_engine_is_stale() -> None:
    async with aiohttp.ClientSession() as session:
        for engine_type in ("vllm", "llamacpp"):
            r = await get_adapter(engine_type).scrape(
                session, f"http://127.0.0.1:{closed_port()}", node_id="x", now=0.0
            )
            assert r.stale and r.node_id == "x"


async def test_llamacpp_scrape_reads_slots(engine: EngineLike) -> None:
    engine.metrics_body = (SAMPLES / "llamacpp.txt").read_text()
    engine.slots_body = (
        '[{"id":0,"n_ctx":4096,"is_processing":true,"n_past":2048},'
        '{"id":1,"n_ctx":4096,"is_processing":false}]'
    )
    adapter = get_adapter("llamacpp")
    async with aiohttp.ClientSession() as session:
        r = await adapter.scrape(session, engine.url, node_id="l", now=0.0)
        assert not r.stale and r.kv_capacity_tokens == 8192
        assert r.kv_usage == pytest.approx(0.25)
        engine.slots_status = 501  # started without --slots: still a report, KV unknown
        r2 = await adapter.scrape(session, engine.url, node_id="l", now=1.0, previous=r)
        assert not r2.stale and r2.kv_capacity_tokens is None
