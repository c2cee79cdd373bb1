"""The llama.cpp adapter against a real llama-server: counters, cached tokens, slots."""

from __future__ import annotations

import asyncio

import pytest

from kvgate.adapters import get_adapter
from kvgate.loadgen.probe import build_workload, client_session, first_model, send

pytestmark = pytest.mark.real_engine


async def test_live_scrape_tracks_prompt_cache_and_slots(llama_servers) -> None:  # type: ignore[no-untyped-def]
    (server,) = llama_servers(1)
    adapter = get_adapter("llamacpp")
    # llama.cpp reuses its cache for this model only past a few hundred tokens (Gemma 3's
    # sliding-window attention); 1,000 is well past that.
    items = build_workload(prefixes=1, per_prefix=2, prefix_tokens=1000)
    async with client_session() as session:
        idle = await adapter.scrape(session, server.url, node_id="l", now=0.0)
        assert not idle.stale
        assert idle.kv_capacity_tokens == 8192  # 2 slots x 4096 from /slots
        assert (idle.running, idle.kv_usage) == (0.0, 0.0)
        model = await first_model(session, server.url)

        # While a long generation runs, the slot and gauge show it.
        long = asyncio.create_task(
            send(session, server.url, model, items[0], repeat=False, max_tokens=48)
        )
        busy = idle
        for _ in range(100):
            await asyncio.sleep(0.1)
            busy = await adapter.scrape(session, server.url, node_id="l", now=1.0, previous=idle)
            if busy.running >= 1 and busy.kv_usage > 0:
                break
        first = await long
        assert busy.running >= 1 and busy.kv_usage > 0, busy

        second = await send(session, server.url, model, items[1], repeat=True, max_tokens=2)
        after = await adapter.scrape(session, server.url, node_id="l", now=10.0, previous=idle)

    assert first.cached_tokens == 0 and second.cached_tokens > 900  # the shared prefix
    assert not after.counters_reset and not after.stale
    assert after.extra["prefix_hits_total"] >= second.cached_tokens
    assert after.extra["prompt_tokens_total"] >= first.prompt_tokens + second.prompt_tokens
    assert after.prompt_tokens_rate > 0 and after.generation_tokens_rate > 0
    assert after.prefix_hit_rate is not None and 0.3 < after.prefix_hit_rate < 0.7


async def test_engine_restart_is_detected(llama_servers) -> None:  # type: ignore[no-untyped-def]
    first, second = llama_servers(2)
    adapter = get_adapter("llamacpp")
    items = build_workload(prefixes=1, per_prefix=1, prefix_tokens=50)
    async with client_session() as session:
        model = await first_model(session, first.url)
        await send(session, first.url, model, items[0], repeat=False, max_tokens=2)
        before = await adapter.scrape(session, first.url, node_id="n", now=0.0)
        first.stop()
        down = await adapter.scrape(session, first.url, node_id="n", now=3.0, previous=before)
        # The node comes back as a fresh process (here: a second server at another URL).
        back = await adapter.scrape(session, second.url, node_id="n", now=6.0, previous=down)
    assert down.stale
    assert back.counters_reset and not back.stale
