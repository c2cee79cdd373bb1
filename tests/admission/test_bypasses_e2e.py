"""The two quota bypasses of issue 12, against a real ``kvgate serve`` on Redis + engine-sim.

1. A class header the key does not allow is refused (403); an allowed degrade-to-async
   class waits in the admission queue instead of running around it.
2. Non-streamed requests with a large max_tokens, after many short ones, reserve their
   full output bound: the tenant never holds more than its hard cap, so the engine never
   runs more of them at once than the cap allows.

A watcher reads the Redis usage and the engine's running count all through each run.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from kvgate.store import Store, open_store
from tests.fixtures.engines import EngineProcess, start_engine_process
from tests.fixtures.gateway import GatewayProcess, start_gateway_process

CAP = 20_000
RUNNING = re.compile(r"^vllm:num_requests_running(?:\{[^}]*\})? ([0-9.e+]+)$", re.M)


@pytest.fixture(scope="module")
def engine() -> Iterator[EngineProcess]:
    process = start_engine_process(profile="llama3-8b-h100", time_scale=100.0, model="sim")
    try:
        yield process
    finally:
        process.stop()


def start(engine: EngineProcess, redis_url: str) -> GatewayProcess:
    tenant = {"hard_cap": CAP, "guaranteed": 0}
    return start_gateway_process(
        config={
            "nodes": [{"id": "e0", "url": engine.url}],
            "store": redis_url,
            "admission": {
                "total_quota": 2 * CAP,
                "tenants": [
                    {"name": "alice", "api_keys": ["k-alice"], **tenant},
                    {
                        "name": "bob",
                        "api_keys": ["k-bob"],
                        "classes": ["interactive", "batch"],
                        **tenant,
                    },
                ],
                "queue": {"default_deadline_s": 120, "max_queue_tokens": 10**6},
                "degrade": {"modes": {"batch": "async"}},
                "output": {"default_max_tokens": 64},
            },
        }
    )


def body(i: int, max_tokens: int | None, stream: bool = False) -> dict[str, Any]:
    b: dict[str, Any] = {
        "model": "sim",
        "stream": stream,
        "ignore_eos": True,  # the simulated engine generates exactly max_tokens
        "messages": [{"role": "user", "content": f"question {i}: tell me a story"}],
    }
    if max_tokens is not None:
        b["max_tokens"] = max_tokens
    return b


class Watcher:
    def __init__(self, store: Store, engine_url: str) -> None:
        self.store = store
        self.engine_url = engine_url
        self.peak_used: dict[str, int] = {}
        self.peak_running = 0.0
        self.reads = 0

    async def run(self, stop: asyncio.Event) -> None:
        async with aiohttp.ClientSession() as s:
            while not stop.is_set():
                for tenant, used in (await self.store.usage()).items():
                    self.peak_used[tenant] = max(self.peak_used.get(tenant, 0), used)
                async with s.get(self.engine_url + "/metrics") as r:
                    m = RUNNING.search(await r.text())
                    if m:
                        self.peak_running = max(self.peak_running, float(m.group(1)))
                self.reads += 1
                await asyncio.sleep(0.01)


def key(tenant: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer k-{tenant}", **extra}


def assert_within_cap(statuses: list[int], watcher: Watcher, tenant: str, tokens: int) -> None:
    """Every request succeeded, and all along (the watcher read the store often) the
    tenant's reservations and the engine's running requests of ``tokens`` each stayed
    within the cap."""
    assert statuses == [200] * len(statuses)
    assert watcher.reads > 20
    assert 0 < watcher.peak_used[tenant] <= CAP
    assert 1 < watcher.peak_running <= CAP // tokens


async def test_class_header_cannot_skip_the_quota(engine, fresh_redis_server) -> None:
    gw = start(engine, fresh_redis_server.url)
    probe = open_store(fresh_redis_server.url)
    watcher, stop = Watcher(probe, engine.url), asyncio.Event()
    watch = asyncio.create_task(watcher.run(stop))
    try:
        async with aiohttp.ClientSession() as s:
            url = gw.url + "/v1/chat/completions"
            headers = key("alice", **{"X-KVGate-Class": "batch"})
            async with s.post(url, json=body(0, 1500), headers=headers) as r:
                assert r.status == 403
                assert (await r.json())["error"]["code"] == "class_not_allowed"

            async def job(i: int) -> int:
                headers = key("bob", **{"X-KVGate-Class": "batch", "Prefer": "respond-async"})
                async with s.post(url, json=body(i, 1500), headers=headers) as r:
                    if r.status != 202:
                        return r.status
                    location = r.headers["Location"]
                while True:
                    async with s.get(gw.url + location, headers=key("bob")) as r:
                        if r.status != 202:
                            return r.status
                    await asyncio.sleep(0.05)

            statuses = await asyncio.wait_for(asyncio.gather(*(job(i) for i in range(60))), 180)
    finally:
        stop.set()
        await watch
        await probe.close()
        gw.stop()
    assert_within_cap(statuses, watcher, "bob", 1500)


async def test_large_non_streamed_requests_stay_within_the_cap(engine, fresh_redis_server) -> None:
    gw = start(engine, fresh_redis_server.url)
    probe = open_store(fresh_redis_server.url)
    watcher, stop = Watcher(probe, engine.url), asyncio.Event()
    try:
        async with aiohttp.ClientSession() as s:
            url = gw.url + "/v1/chat/completions"
            for i in range(30):  # short streams first: nothing is learned from them
                async with s.post(url, json=body(i, 8, stream=True), headers=key("alice")) as r:
                    assert r.status == 200
                    await r.read()
            # no max_tokens: the engine is told the reserved default bound
            async with s.post(url, json=body(99, None), headers=key("alice")) as r:
                assert r.status == 200
                assert (await r.json())["usage"]["completion_tokens"] == 64
                assert "reserved=" in r.headers["X-KVGate-Admission"]
            watch = asyncio.create_task(watcher.run(stop))

            async def call(i: int) -> int:
                async with s.post(url, json=body(i, 2000), headers=key("alice")) as r:
                    await r.read()
                    return r.status

            statuses = await asyncio.wait_for(asyncio.gather(*(call(i) for i in range(60))), 180)
            stop.set()
            await watch
    finally:
        stop.set()
        await probe.close()
        gw.stop()
    assert_within_cap(statuses, watcher, "alice", 2000)
