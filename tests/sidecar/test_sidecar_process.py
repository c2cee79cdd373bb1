"""``kvgate sidecar`` as a process with a real Redis or etcd: lease, SIGTERM drain, metrics."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from kvgate.store import open_store
from kvgate.store.base import KVStore
from kvgate.store.keys import node_key
from tests.fixtures.engines import EngineProcess
from tests.fixtures.poll import poll_until
from tests.fixtures.servers import free_port
from tests.sidecar.conftest import SidecarProcess


@pytest.fixture(params=["redis_server", "etcd_server"])
async def store_url(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    server: Any = request.getfixturevalue(request.param)
    yield server.url


async def wait_for(
    store: KVStore, key: str, predicate: Callable[[dict[str, Any] | None], bool], limit_s: float
) -> dict[str, Any] | None:
    async def entry() -> dict[str, Any] | None:
        raw = await store.get(key)
        return json.loads(raw) if raw else None

    return await poll_until(entry, predicate, limit_s, interval_s=0.05, what=key)


async def test_registers_and_lease_expires_when_killed(
    store_url: str,
    sim_engines: Callable[..., EngineProcess],
    sidecars: Callable[..., SidecarProcess],
) -> None:
    engine = sim_engines()
    node_id = f"lease-{uuid.uuid4().hex[:8]}"
    metrics_port = free_port()
    side = sidecars(
        engine.url, store_url, node_id, "--lease-ttl", "2", "--metrics-port", str(metrics_port)
    )
    store = open_store(store_url)
    key = node_key(node_id)
    try:
        entry = await wait_for(store, key, lambda e: e is not None, 20)
        assert entry is not None and entry["url"] == engine.url
        assert entry["state_hint"] == "healthy" and entry["engine_type"] == "sim"
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{metrics_port}/metrics") as resp,
        ):
            text = await resp.text()
        assert 'kvgate_sidecar_scrapes_total{result="ok"}' in text
        assert "kvgate_sidecar_last_report_age_seconds" in text
        side.process.kill()  # no chance to deregister: only the lease removes the node
        killed_at = time.monotonic()
        await wait_for(store, key, lambda e: e is None, 12)
        assert time.monotonic() - killed_at >= 0.5  # it was the lease, not a delete
    finally:
        await store.close()


async def test_sigterm_drains_in_flight_requests_then_deregisters(
    store_url: str,
    sim_engines: Callable[..., EngineProcess],
    sidecars: Callable[..., SidecarProcess],
) -> None:
    engine = sim_engines(time_scale=2.0)
    node_id = f"drain-{uuid.uuid4().hex[:8]}"
    side = sidecars(engine.url, store_url, node_id, "--drain-timeout", "30", interval=0.2)
    store = open_store(store_url)
    key = node_key(node_id)
    body = {"prompt": "drain me " * 30, "max_tokens": 80, "ignore_eos": True}
    try:
        await wait_for(store, key, lambda e: e is not None, 20)
        async with aiohttp.ClientSession() as session:

            async def one() -> tuple[int, dict[str, Any], float]:
                async with session.post(f"{engine.url}/v1/completions", json=body) as resp:
                    return resp.status, await resp.json(), time.monotonic()

            in_flight = [asyncio.create_task(one()) for _ in range(3)]
            await wait_for(store, key, lambda e: e is not None and e["running"] > 0, 10)
            side.process.send_signal(signal.SIGTERM)
            quiescing = await wait_for(
                store, key, lambda e: e is not None and e["state_hint"] == "quiescing", 10
            )
            assert quiescing is not None
            results = await asyncio.gather(*in_flight)
        await wait_for(store, key, lambda e: e is None, 15)
        gone_at = time.monotonic()
        rc = await asyncio.to_thread(side.process.wait, 15)
    finally:
        await store.close()
    assert rc == 0, side.log()
    assert all(status == 200 and r["usage"]["completion_tokens"] == 80 for status, r, _ in results)
    assert gone_at >= max(done for _, _, done in results) - 0.1
