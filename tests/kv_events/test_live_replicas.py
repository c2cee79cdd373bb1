"""engine-sim publishing KV events; two gateway replicas subscribing to the same stream.

Both replicas must hold the engine's true cache (not a guess), and so agree with each
other, after prefixes were cached, evicted and reset — with no state shared between them.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from kvgate.engine.profiles import get_profile
from kvgate.engine.server import EngineServer
from kvgate.kv_events.publisher import KvEventPublisher
from kvgate.kv_events.tokenizer import PromptHasher
from kvgate.tokens import synthetic_text
from tests.fixtures.gateway import InProcessGateway, running_gateway

MODEL = "sim-model"


async def _engine(tokenizer: Path) -> tuple[EngineServer, web.AppRunner, str]:
    publisher = KvEventPublisher("tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0")
    hasher = PromptHasher(tokenizer, block_size=16, seed="0")
    server = EngineServer(
        get_profile("gemma3-270m-cpu"),
        model_name=MODEL,
        time_scale=50.0,
        kv_blocks=48,  # a few prompts fill it: eviction happens
        kv_events=publisher,
        prompt_hasher=hasher,
    )
    runner = web.AppRunner(server.make_app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return server, runner, f"http://127.0.0.1:{port}"


def _config(url: str, server: EngineServer, tokenizer: Path, hashes: str) -> dict[str, object]:
    pub = server.publisher
    assert pub is not None
    return {
        "nodes": [
            {
                "id": "e0",
                "url": url,
                "model": MODEL,
                "engine_type": "sim",
                "kv_events": {
                    "endpoint": pub.bound_endpoint,
                    "replay_endpoint": pub.bound_replay_endpoint,
                    "hashes": hashes,
                },
            }
        ],
        "routing": {"policy": "precise", "scrape_interval_s": 0.2},
        "kv_events": {"tokenizers": {MODEL: str(tokenizer)}, "hash_seed": "0"},
    }


async def _caught_up(gateways: list[InProcessGateway], server: EngineServer) -> None:
    assert server.publisher is not None
    for _ in range(200):
        server.publish_cache_events()
        want = server.publisher.next_seq
        subs = [g.gateway.kv_events.subscribers["e0"] for g in gateways]  # type: ignore[union-attr]
        if all(s.next_seq == want for s in subs):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"subscribers did not catch up to seq {want}")


@pytest.fixture
async def cluster(
    tokenizer_path: Path,
) -> AsyncIterator[tuple[EngineServer, list[InProcessGateway]]]:
    server, runner, url = await _engine(tokenizer_path)
    try:
        async with AsyncExitStack() as stack:
            # Replica 0 indexes the engine's hashes; replica 1 re-keys every stored block
            # from its token ids (the SGLang path): both must land on the same state.
            gws = [
                await stack.enter_async_context(
                    running_gateway(_config(url, server, tokenizer_path, hashes))
                )
                for hashes in ("engine", "tokens")
            ]
            yield server, gws
    finally:
        await runner.cleanup()


async def test_two_replicas_hold_the_engines_true_cache(
    cluster: tuple[EngineServer, list[InProcessGateway]], tokenizer_path: Path
) -> None:
    server, gws = cluster
    rng = random.Random(7)
    prefixes = [synthetic_text(16 * rng.randint(6, 12), rng) for _ in range(8)]
    prompts = [p + synthetic_text(rng.randint(1, 20), rng) for p in prefixes for _ in range(2)]
    hasher = PromptHasher(tokenizer_path, block_size=16, seed="0")
    pool = server.core.scheduler.kv.pool
    reset_url = gws[0].gateway.config.nodes[0].url + "/reset_prefix_cache"
    async with aiohttp.ClientSession() as session:
        for i, prompt in enumerate(prompts):
            gw = gws[i % 2]  # work arrives through both replicas
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 3}
            async with session.post(gw.url + "/v1/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                assert resp.headers["X-KVGate-Node"] == "e0"
            if i == 3:  # a reset early on: cached blocks in use survive it
                async with session.post(reset_url, json={}) as resp:
                    assert resp.status == 200
        await _caught_up(gws, server)
        assert pool.evictions > 0  # the run cached, evicted and reused blocks
        truth = set(pool.cached)
        assert truth
        views = [g.gateway.kv_events.index for g in gws]  # type: ignore[union-attr]
        rekeyed = gws[1].gateway.kv_events.subscribers["e0"].rehasher
        assert gws[0].gateway.kv_events.subscribers["e0"].rehasher is None
        assert rekeyed is not None and rekeyed.skipped == 0  # every block re-keyed
        assert views[0].blocks_of("e0") == truth
        assert views[1].blocks_of("e0") == truth
        now = 0.0
        for prompt in prompts:
            _, hashes = hasher.hash_text(prompt)
            true_blocks = len(pool.lookup(hashes))
            predicted = [v.match(hashes, now, ["e0"]).get("e0", 0) for v in views]
            assert predicted == [true_blocks, true_blocks]
        # Each replica's prediction for a request (its own tokenizer + hash of the prompt)
        # is what the engine then reports as cached.
        for gw in gws:
            prompt = prompts[-1]
            _, hashes = hasher.hash_text(prompt)
            assert pool.lookup(hashes)  # the prefix is cached now
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 2}
            async with session.post(gw.url + "/v1/completions", json=body) as resp:
                assert resp.status == 200
                expected = int(resp.headers["X-KVGate-Expected-Cached-Tokens"])
                usage = (await resp.json())["usage"]
            assert expected == usage["prompt_tokens_details"]["cached_tokens"] > 0
            assert resp.headers["X-KVGate-Route-Reason"] == "precise_match"
        await _caught_up(gws, server)
        # A reset clears the engine's cache and both replicas follow.
        async with session.post(reset_url, json={}) as resp:
            assert resp.status == 200
        await _caught_up(gws, server)
        assert views[0].blocks_of("e0") == views[1].blocks_of("e0") == set(pool.cached)
