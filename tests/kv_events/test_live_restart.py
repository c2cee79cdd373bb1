"""An engine restarts behind a subscribed gateway: its old cache entries must go."""

from __future__ import annotations

import asyncio
import random

import aiohttp
from aiohttp import web

from kvgate.engine.profiles import get_profile
from kvgate.engine.server import EngineServer
from kvgate.kv_events.publisher import KvEventPublisher
from kvgate.tokens import synthetic_text
from tests.fixtures.gateway import InProcessGateway, running_gateway


async def _serve(events: str, replay: str, port: int) -> tuple[EngineServer, web.AppRunner, int]:
    server = EngineServer(
        get_profile("gemma3-270m-cpu"),
        model_name="m",
        time_scale=50.0,
        kv_blocks=64,
        kv_events=KvEventPublisher(events, replay_endpoint=replay),
    )
    runner = web.AppRunner(server.make_app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, reuse_address=True)
    await site.start()
    return server, runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


async def _caught_up(gw: InProcessGateway, server: EngineServer) -> None:
    assert server.publisher is not None
    sub = gw.gateway.kv_events.subscribers["e0"]
    for _ in range(250):
        server.publish_cache_events()
        if sub.next_seq == server.publisher.next_seq and gw.gateway.kv_events.index.is_synced("e0"):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"subscriber at {sub.next_seq}, publisher at {server.publisher.next_seq}")


async def _send(session: aiohttp.ClientSession, url: str, prompts: list[str]) -> None:
    for prompt in prompts:
        body = {"model": "m", "prompt": prompt, "max_tokens": 2}
        async with session.post(url + "/v1/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()


async def test_a_restarted_engine_is_resynced() -> None:
    server, runner, port = await _serve("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", 0)
    assert server.publisher is not None
    events, replay = server.publisher.bound_endpoint, server.publisher.bound_replay_endpoint
    assert events and replay
    node = {"id": "e0", "url": f"http://127.0.0.1:{port}", "model": "m", "engine_type": "sim",
            "kv_events": {"endpoint": events, "replay_endpoint": replay}}  # fmt: skip
    rng = random.Random(1)
    try:
        async with (
            running_gateway({"nodes": [node], "routing": {"policy": "precise"}}) as gw,
            aiohttp.ClientSession() as session,
        ):
            await _send(session, gw.url, [synthetic_text(100, rng) for _ in range(6)])
            await _caught_up(gw, server)
            index = gw.gateway.kv_events.index
            old = set(server.core.scheduler.kv.pool.cached)
            assert index.blocks_of("e0") == old and len(old) > 6
            old_seq = server.publisher.next_seq

            await runner.cleanup()  # the engine goes away (its publisher with it)
            server, runner, _ = await _serve(events, replay, port)  # back, empty cache
            await asyncio.sleep(0.3)  # ZMQ reconnects the SUB socket
            await _send(session, gw.url, [synthetic_text(40, rng)])
            await _caught_up(gw, server)
            assert server.publisher is not None and server.publisher.next_seq < old_seq
            new = set(server.core.scheduler.kv.pool.cached)
            assert index.blocks_of("e0") == new
            assert not (old & index.blocks_of("e0"))
            # Seen as the sequence starting over (or, if a scrape noticed the restart
            # first, as the node re-registering): either way one resync, not a gap fill.
            resyncs = [
                gw.gateway.registry.get_sample_value(
                    "kvgate_kv_events_resyncs_total", {"node": "e0", "reason": reason}
                )
                or 0.0
                for reason in ("restart", "reregister", "gap")
            ]
            assert resyncs[0] + resyncs[1] >= 1 and resyncs[2] == 0
    finally:
        await runner.cleanup()
