"""The sidecar loop in-process against real simulated engines (``kvgate engine-sim``).

The store is a real Redis (a fresh key per test); the engine is a real subprocess on a
free port. Fast intervals keep each test short.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from kvgate.procs.ports import free_port
from kvgate.sidecar.decision import SaturationPolicy
from kvgate.sidecar.sidecar import Sidecar, SidecarConfig
from kvgate.store import open_store
from kvgate.store.base import KVStore
from kvgate.store.keys import NODES_PREFIX, node_key
from kvgate.types import NodeState
from tests.fixtures.engines import EngineProcess
from tests.fixtures.poll import poll_until

FAST = SaturationPolicy(
    waiting_high=3,
    waiting_low=0.5,
    recover_hold_s=0.6,
    reregister_hold_s=0.6,
    unreachable_after_s=0.4,
)


@pytest.fixture
async def store(redis_server: Any) -> AsyncIterator[KVStore]:
    s = open_store(redis_server.url)
    await s.delete(node_key("sim-1"))
    yield s
    await s.delete(node_key("sim-1"))
    await s.close()


def config(url: str, **kw: object) -> SidecarConfig:
    base: dict[str, object] = {
        "engine_url": url,
        "engine_type": "sim",
        "node_id": "sim-1",
        "interval_s": 0.2,
        "lease_ttl_s": 2.0,
        "window_s": 0.5,
        "drain_poll_s": 0.05,
        "policy": FAST,
        "pool": "economy",
    }
    base.update(kw)
    return SidecarConfig(**base)  # type: ignore[arg-type]


async def complete(session: aiohttp.ClientSession, url: str, max_tokens: int) -> dict:  # type: ignore[type-arg]
    body = {"prompt": "tell me a story " * 20, "max_tokens": max_tokens, "ignore_eos": True}
    async with session.post(f"{url}/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        data = await resp.json()
    data["_done_at"] = time.monotonic()
    return data  # type: ignore[no-any-return]


async def stored(store: KVStore, node_id: str = "sim-1") -> dict | None:  # type: ignore[type-arg]
    value = await store.get(node_key(node_id))
    return json.loads(value) if value else None


async def test_registers_with_url_model_capacity_and_pool(
    sim_engines: Callable[..., EngineProcess],
    store: KVStore,
) -> None:
    engine = sim_engines(kv_blocks=256)
    sidecar = Sidecar(config(engine.url), store)
    try:
        await sidecar.tick()
        entry = await stored(store)
    finally:
        await sidecar.close()
    assert entry is not None
    assert entry["url"] == engine.url and entry["engine_type"] == "sim"
    assert entry["model"] == "google/gemma-3-270m-it"  # discovered from /v1/models
    assert entry["state_hint"] == "healthy" and entry["pool"] == "economy"
    assert entry["kv_capacity_tokens"] == 256 * 16
    assert not entry["stale"]
    metrics = sidecar.registry.get_sample_value("kvgate_sidecar_scrapes_total", {"result": "ok"})
    assert metrics == 1.0


async def test_sigterm_style_stop_drains_in_flight_requests_then_deregisters(
    sim_engines: Callable[..., EngineProcess],
    store: KVStore,
) -> None:
    engine = sim_engines(time_scale=2.0)
    sidecar = Sidecar(config(engine.url), store)
    events: list[tuple[float, str | None]] = []

    async def watch() -> None:
        async for ev in store.watch_prefix(NODES_PREFIX):
            state = json.loads(ev.value)["state_hint"] if ev.value else None
            events.append((time.monotonic(), state))

    watcher = asyncio.create_task(watch())
    stop = asyncio.Event()
    run = asyncio.create_task(sidecar.run(stop))
    async with aiohttp.ClientSession() as session:
        requests = [asyncio.create_task(complete(session, engine.url, 60)) for _ in range(3)]
        for _ in range(100):  # until the engine reports them running
            await asyncio.sleep(0.05)
            if sidecar.last_raw is not None and sidecar.last_raw.running >= 1:
                break
        stop.set()  # what the CLI's SIGTERM handler does
        results = await asyncio.gather(*requests)
        await asyncio.wait_for(run, timeout=20)
    for _ in range(100):  # the store's watch delivers the deletion asynchronously
        if events and events[-1][1] is None:
            break
        await asyncio.sleep(0.05)
    watcher.cancel()

    # No in-flight request was lost: all finished in full.
    assert all(r["usage"]["completion_tokens"] == 60 for r in results)
    states = [s for _, s in events]
    assert "quiescing" in states and states[-1] is None  # deregistered last
    deleted_at = events[-1][0]
    assert deleted_at >= max(r["_done_at"] for r in results) - 0.05
    assert await store.get(node_key("sim-1")) is None
    assert sidecar.decider.drained


async def test_engine_restart_reregisters_then_healthy(
    sim_engines: Callable[..., EngineProcess],
    store: KVStore,
) -> None:
    port = free_port()
    engine = sim_engines(extra_args=["--base-port", str(port)])
    sidecar = Sidecar(config(engine.url), store)
    seen: list[str] = []

    async def tick() -> str:
        seen.append(str((await sidecar.tick()).state_hint))
        return seen[-1]

    async def tick_until(state: str, limit_s: float = 10.0) -> None:
        await poll_until(tick, lambda s: s == state, limit_s, what=f"{state}: {seen}")

    try:
        async with aiohttp.ClientSession() as session:
            await complete(session, engine.url, 5)  # some counters to go backwards
        await tick_until("healthy")
        engine.kill()
        await tick_until("unreachable")
        sim_engines(extra_args=["--base-port", str(port)])  # same address, new process
        await tick_until("re-register")
        assert sidecar.decider.restarts == 1
        entry = await stored(store)
        assert entry is not None and entry["counters_reset"]
        await tick_until("healthy")
    finally:
        await sidecar.close()
    assert sidecar.registry.get_sample_value("kvgate_sidecar_engine_restarts_total") == 1.0


async def test_saturation_backs_off_and_recovers(
    sim_engines: Callable[..., EngineProcess],
    store: KVStore,
) -> None:
    engine = sim_engines(time_scale=4.0, extra_args=["--max-num-seqs", "1"])
    sidecar = Sidecar(config(engine.url), store)
    states: list[NodeState | None] = []
    try:
        async with aiohttp.ClientSession() as session:
            await sidecar.tick()
            burst = [asyncio.create_task(complete(session, engine.url, 40)) for _ in range(8)]
            while not all(t.done() for t in burst):
                states.append((await sidecar.tick()).state_hint)
                await asyncio.sleep(0.1)
            await asyncio.gather(*burst)
        assert NodeState.BACKOFF in states, states
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and states[-1] is not NodeState.HEALTHY:
            await asyncio.sleep(0.1)
            states.append((await sidecar.tick()).state_hint)
    finally:
        await sidecar.close()
    assert states[-1] is NodeState.HEALTHY, states
    first_backoff = states.index(NodeState.BACKOFF)
    # hysteresis: once in backoff it stays there for at least the recovery hold
    assert states[first_backoff : first_backoff + 3] == [NodeState.BACKOFF] * 3
