"""EngineServer in the test's event loop (for fault injection and engine state)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from kvgate.engine.profiles import get_profile
from kvgate.engine.server import EngineServer


@pytest.fixture
async def served() -> AsyncIterator[tuple[EngineServer, str]]:
    server = EngineServer(get_profile("gemma3-270m-cpu"), time_scale=20.0)
    runner = web.AppRunner(server.make_app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield server, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_disconnected_stream_aborts_its_request(served: tuple[EngineServer, str]) -> None:
    server, url = served
    body = {"prompt": "long answer please", "max_tokens": 2000, "ignore_eos": True, "stream": True}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/v1/completions", json=body) as resp,
    ):
        await resp.content.readline()  # first chunk arrived
    for _ in range(100):
        if server.core.stats().aborted == 1:
            break
        await asyncio.sleep(0.02)
    stats = server.core.stats()
    assert stats.aborted == 1 and stats.running == 0
    assert stats.num_free_blocks == stats.num_gpu_blocks


async def test_a_failed_driver_answers_500_not_silence(served: tuple[EngineServer, str]) -> None:
    server, url = served

    def broken(t: float) -> list:  # type: ignore[type-arg]
        raise RuntimeError("injected fault")

    server.core.advance_to = broken  # type: ignore[method-assign]
    async with aiohttp.ClientSession() as session:
        body = {"prompt": "hello", "max_tokens": 3}
        async with session.post(url + "/v1/completions", json=body) as resp:
            assert resp.status == 500
            assert (await resp.json())["error"]["code"] == "engine_failed"
        async with session.post(url + "/v1/completions", json=body) as resp:
            assert resp.status == 500
