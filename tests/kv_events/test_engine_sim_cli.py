"""``kvgate engine-sim --kv-events-endpoint … --tokenizer …`` as a process: two engines,
each on its own offset endpoint, publishing vLLM-hashed blocks a subscriber can match."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import zmq.asyncio

from kvgate.kv_events.index import PreciseIndex
from kvgate.kv_events.metrics import KvEventMetrics
from kvgate.kv_events.subscriber import KvEventSubscriber
from kvgate.kv_events.tokenizer import PromptHasher
from kvgate.procs.ports import free_port_run
from kvgate.tokens import _WORDS
from tests.fixtures.engines import start_engine_process


async def test_engine_sim_process_publishes_vllm_hashed_blocks(tokenizer_path: Path) -> None:
    base = free_port_run(4)
    engines = start_engine_process(
        count=2,
        extra_args=[
            "--kv-events-endpoint", f"tcp://127.0.0.1:{base}",
            "--kv-events-replay-endpoint", f"tcp://127.0.0.1:{base + 2}",
            "--tokenizer", str(tokenizer_path), "--hash-seed", "42",
        ],
    )  # fmt: skip
    ctx = zmq.asyncio.Context()
    index = PreciseIndex()
    subs = [
        KvEventSubscriber(
            f"e{i}",
            f"tcp://127.0.0.1:{base + i}",
            index=index,
            metrics=KvEventMetrics(),
            context=ctx,
            replay_endpoint=f"tcp://127.0.0.1:{base + 2 + i}",
        )
        for i in range(2)
    ]
    try:
        for sub in subs:
            sub.start()
        await asyncio.sleep(0.3)
        prompt = " ".join(_WORDS[i % len(_WORDS)] for i in range(100))
        async with aiohttp.ClientSession() as session:
            body = {"prompt": prompt, "max_tokens": 2}
            async with session.post(engines.urls[1] + "/v1/completions", json=body) as resp:
                assert resp.status == 200
                usage = (await resp.json())["usage"]
        hasher = PromptHasher(tokenizer_path, seed="42")
        n_tokens, hashes = hasher.hash_text(prompt)
        assert usage["prompt_tokens"] == n_tokens  # the engine counted the tokenizer's ids
        for _ in range(100):
            if index.match(hashes, 0.0).get("e1") == len(hashes):
                break
            await asyncio.sleep(0.05)
        assert index.match(hashes, 0.0) == {"e1": len(hashes)}  # only engine 1 served it
        other_seed = PromptHasher(tokenizer_path, seed="0").hash_text(prompt)[1]
        assert index.match(other_seed, 0.0) == {}
    finally:
        for sub in subs:
            await sub.stop()
        ctx.term()
        engines.stop()
