"""The store interface on every backend: key/value with TTL and watches, and counters."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from kvgate.store import ReserveLimits, Store, StoreUnavailable, WatchEvent, open_store
from kvgate.store.composite import CompositeStore
from kvgate.store.memory import MemoryStore

LIMITS = ReserveLimits(
    total=1000, tenant_cap=700, guaranteed=200, elastic_pool=500, tenant_elastic_limit=500
)


@pytest.fixture(params=["memory", "redis", "redis+etcd"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    if request.param == "memory":
        s: Store = open_store("memory://")
    elif request.param == "redis":
        s = open_store(request.getfixturevalue("fresh_redis_server").url)
    else:
        redis_url = request.getfixturevalue("fresh_redis_server").url
        s = open_store(f"{redis_url},{request.getfixturevalue('etcd_server').url}")
        assert isinstance(s, CompositeStore)
    await s.set_guarantees({"a": 200, "b": 300})
    try:
        yield s
    finally:
        for key in await s.get_prefix("/kvgate/test/"):
            await s.delete(key)
        await s.close()


async def test_key_value_with_ttl_and_prefix(store: Store) -> None:
    await store.put("/kvgate/test/x", "1")
    await store.put("/kvgate/test/y", "2", ttl=1.0)
    assert await store.get("/kvgate/test/x") == "1"
    assert await store.get_prefix("/kvgate/test/") == {"/kvgate/test/x": "1", "/kvgate/test/y": "2"}
    assert await store.delete("/kvgate/test/x")
    assert await store.get("/kvgate/test/x") is None
    for _ in range(80):  # etcd rounds lease TTLs up to its minimum (~2 s)
        if await store.get("/kvgate/test/y") is None:
            break
        await asyncio.sleep(0.05)
    assert await store.get("/kvgate/test/y") is None


async def test_watch_sees_puts_and_deletes(store: Store) -> None:
    events: list[WatchEvent] = []

    async def watch() -> None:
        async for event in store.watch_prefix("/kvgate/test/w/"):
            events.append(event)

    task = asyncio.create_task(watch())
    await asyncio.sleep(0.3)
    await store.put("/kvgate/test/w/a", "on")
    await store.put("/kvgate/test/other", "ignored")
    await asyncio.sleep(0.4)
    await store.delete("/kvgate/test/w/a")
    for _ in range(40):
        if len(events) >= 2:
            break
        await asyncio.sleep(0.05)
    task.cancel()
    assert events == [WatchEvent("/kvgate/test/w/a", "on"), WatchEvent("/kvgate/test/w/a", None)]


async def test_reserve_checks_cap_total_and_elastic_pool(store: Store) -> None:
    ok = await store.reserve("g1", "a", 200, LIMITS)
    assert (ok.ok, ok.reason) == (True, "within_guarantee")
    assert (await store.reserve("g1", "a", 300, LIMITS)).reason == "elastic"
    refused = await store.reserve("g1", "a", 300, LIMITS)
    assert (refused.ok, refused.reason) == (False, "tenant_cap")
    # a's 300 elastic tokens leave 200 of the pool; b's guarantee is untouched
    b_limits = ReserveLimits(1000, 700, 300, 500, 500)
    assert (await store.reserve("g2", "b", 300, b_limits)).reason == "within_guarantee"
    refused = await store.reserve("g2", "b", 201, b_limits)
    assert (refused.ok, refused.reason) == (False, "total")
    assert (await store.reserve("g2", "b", 200, b_limits)).ok
    refused = await store.reserve("g2", "b", 1, ReserveLimits(2000, 700, 300, 500, 500))
    assert (refused.ok, refused.reason) == (False, "elastic_pool")
    assert await store.usage() == {"a": 500, "b": 500}
    share = ReserveLimits(1000, 700, 200, 500, 100)
    await store.release("g1", "a", 500)
    assert (await store.reserve("g1", "a", 301, share)).reason == "tenant_share"


async def test_release_never_returns_more_than_the_gateway_holds(store: Store) -> None:
    await store.reserve("g1", "a", 100, LIMITS)
    await store.reserve("g2", "a", 100, LIMITS)
    await store.release("g1", "a", 500)
    assert await store.usage() == {"a": 100}
    await store.adjust("g2", "a", 50)
    assert await store.usage() == {"a": 150}
    await store.adjust("g2", "a", -150)
    assert await store.usage() == {}


async def test_expired_gateway_lease_returns_its_tokens(store: Store) -> None:
    await store.heartbeat("dead", 0.3)
    await store.heartbeat("alive", 30)
    await store.reserve("dead", "a", 250, LIMITS)
    await store.reserve("alive", "b", 100, LIMITS)
    assert await store.reap() == 0
    await asyncio.sleep(0.45)
    await store.heartbeat("alive", 30)
    assert await store.reap() == 250
    assert await store.usage() == {"b": 100}


async def test_unreachable_redis_raises_store_unavailable() -> None:
    from tests.fixtures.servers import free_port

    s = open_store(f"redis://127.0.0.1:{free_port()}")
    with pytest.raises(StoreUnavailable):
        await s.reserve("g", "a", 1, LIMITS)
    with pytest.raises(StoreUnavailable):
        await s.get("/kvgate/x")
    await s.close()


def test_open_store_urls() -> None:
    assert isinstance(open_store("memory://"), MemoryStore)
    with pytest.raises(ValueError, match="unknown URL"):
        open_store("mongo://x")
    with pytest.raises(ValueError, match="pair"):
        open_store("memory://,memory://")
