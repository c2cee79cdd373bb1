"""Two real ``kvgate serve`` processes on one Redis, in front of a simulated engine."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from kvgate.store import open_store
from tests.fixtures.engines import EngineProcess, start_engine_process
from tests.fixtures.gateway import GatewayProcess, start_gateway_process

TOTAL = 1200
TENANTS = [
    {"name": "a", "api_keys": ["key-a"], "guaranteed": 500, "weight": 1},
    {"name": "b", "api_keys": ["key-b"], "guaranteed": 300, "weight": 1},
]


@pytest.fixture(scope="module")
def engine() -> Iterator[EngineProcess]:
    process = start_engine_process(time_scale=50.0, model="sim")
    try:
        yield process
    finally:
        process.stop()


def gateway(engine: EngineProcess, redis_url: str, name: str, **admission: Any) -> GatewayProcess:
    return start_gateway_process(
        config={
            "server": {"gateway_id": name},
            "nodes": [{"id": "e0", "url": engine.url}],
            "store": redis_url,
            "admission": {
                "total_quota": TOTAL,
                "tenants": TENANTS,
                "lease_ttl_s": 1.0,
                "queue": {"default_deadline_s": 30, "max_queue_tokens": 10**6},
                **admission,
            },
        }
    )


def body(i: int, max_tokens: int, stream: bool = False) -> dict[str, Any]:
    return {
        "model": "sim",
        "max_tokens": max_tokens,
        "stream": stream,
        "ignore_eos": True,  # the simulated engine generates exactly max_tokens
        "messages": [{"role": "user", "content": f"request {i} " + "word " * 40}],
    }


async def test_two_gateways_share_one_quota(engine, fresh_redis_server) -> None:
    gateways = [gateway(engine, fresh_redis_server.url, f"gw-{i}") for i in range(2)]
    probe = open_store(fresh_redis_server.url)
    statuses: list[int] = []
    samples: list[dict[str, int]] = []
    try:
        async with aiohttp.ClientSession() as session:

            async def client(gw: GatewayProcess, key: str, n: int, offset: int) -> None:
                for i in range(n):
                    headers = {"Authorization": f"Bearer {key}"}
                    async with session.post(
                        gw.url + "/v1/chat/completions",
                        json=body(offset + i, 120),
                        headers=headers,
                    ) as r:
                        await r.read()
                        statuses.append(r.status)

            clients = [
                asyncio.create_task(client(gw, key, 4, 100 * j))
                for j, (gw, key) in enumerate(
                    (g, k) for g in gateways for k in ("key-a", "key-b") for _ in range(4)
                )
            ]
            while not all(c.done() for c in clients):
                samples.append(await probe.usage())
                await asyncio.sleep(0.01)
            await asyncio.gather(*clients)
        assert statuses.count(200) == len(statuses) == 16 * 4, set(statuses)
        assert len(samples) > 20
        assert max(sum(s.values()) for s in samples) <= TOTAL
        contended = [s for s in samples if sum(s.values()) > TOTAL - 200]
        assert contended, "the run never filled the quota"
        # while contended, each tenant holds its guarantee (within one request's size)
        for tenant, guaranteed in (("a", 500), ("b", 300)):
            ok = sum(s.get(tenant, 0) >= guaranteed - 200 for s in contended) / len(contended)
            assert ok > 0.5, f"tenant {tenant} held its guarantee in {ok:.0%} of samples"
        assert await probe.usage() == {}
    finally:
        await probe.close()
        for gw in gateways:
            gw.stop()


async def test_killed_gateway_returns_its_reservations_within_the_lease(
    fresh_redis_server,
) -> None:
    # an engine at wall-clock speed: each 450-token stream runs for seconds, so both are
    # still held when usage is read and when the gateway dies (at 50x a stream could end
    # first and its release would make the figures race)
    slow = start_engine_process(time_scale=1.0, model="sim")
    doomed = gateway(slow, fresh_redis_server.url, "gw-doomed")
    survivor = gateway(slow, fresh_redis_server.url, "gw-survivor")
    probe = open_store(fresh_redis_server.url)
    try:
        async with aiohttp.ClientSession() as session:
            responses = []
            for i, key in enumerate(("key-a", "key-b")):
                r = await session.post(
                    doomed.url + "/v1/chat/completions",
                    json=body(i, 450, stream=True),
                    headers={"Authorization": f"Bearer {key}"},
                )
                assert r.status == 200
                await r.content.readuntil(b"\n\n")
                responses.append(r)
            held = await probe.usage()
            assert held.get("a", 0) > 0 and held.get("b", 0) > 0
            doomed.kill()  # kill -9: no release, no cleanup
            killed_at = time.monotonic()
            for r in responses:
                r.close()
        while await probe.usage():
            # lease TTL 1 s + the survivor's heartbeat period + margin for a loaded machine
            assert time.monotonic() - killed_at < 4.0, await probe.usage()
            await asyncio.sleep(0.05)
        async with aiohttp.ClientSession() as session, session.get(survivor.url + "/metrics") as r:
            metrics = await r.text()
        reclaimed = [
            float(line.split()[-1])
            for line in metrics.splitlines()
            if line.startswith("kvgate_admission_reclaimed_tokens_total")
        ]
        assert reclaimed and reclaimed[0] == sum(held.values())
    finally:
        await probe.close()
        doomed.stop()
        survivor.stop()
        slow.stop()


async def test_full_queue_answers_429_with_retry_after(engine) -> None:
    gw = start_gateway_process(
        config={
            "nodes": [{"id": "e0", "url": engine.url}],
            "admission": {"total_quota": 600, "queue": {"max_queue_tokens": 0}},
        }
    )
    try:
        async with aiohttp.ClientSession() as session:
            first = await session.post(
                gw.url + "/v1/chat/completions", json=body(0, 450, stream=True)
            )
            assert first.status == 200
            await first.content.readuntil(b"\n\n")
            async with session.post(gw.url + "/v1/chat/completions", json=body(1, 450)) as r:
                assert r.status == 429
                assert int(r.headers["Retry-After"]) >= 1
                assert r.headers["X-KVGate-Admission"].startswith("reject; reason=queue_full")
                error = (await r.json())["error"]
                assert set(error) >= {"message", "type", "param", "code"}
            first.close()
    finally:
        gw.stop()
