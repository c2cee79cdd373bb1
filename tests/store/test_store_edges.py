"""Store edges on a real Redis: fenced leases, re-registration, outages and hysteresis."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kvgate.store import ReserveLimits, StoreUnavailable
from kvgate.store.redis_store import RedisStore

LIMITS = ReserveLimits(
    total=10_000, tenant_cap=10_000, guaranteed=0, elastic_pool=10_000, tenant_elastic_limit=10_000
)


def redis_store(server: Any) -> RedisStore:
    return RedisStore(server.url, recover_after_s=0.3, probe_interval_s=0.05)


@pytest.fixture
async def two_clients(fresh_redis_server: Any) -> AsyncIterator[tuple[RedisStore, RedisStore]]:
    """Two gateways' clients of one Redis, closed after the test."""
    a, b = redis_store(fresh_redis_server), redis_store(fresh_redis_server)
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


async def test_a_reaped_gateway_re_registers_what_it_holds_before_writing(
    two_clients: tuple[RedisStore, RedisStore],
) -> None:
    frozen, other = two_clients
    await frozen.heartbeat("frozen", 0.3)
    await other.heartbeat("other", 30)
    assert (await frozen.reserve("frozen", "a", 100, LIMITS)).ok
    assert (await frozen.reserve("frozen", "b", 50, LIMITS)).ok
    await asyncio.sleep(0.45)  # "frozen" misses its heartbeats: the lease expires
    assert await other.reap() == 150
    assert await other.usage() == {}
    assert not await frozen.has_lease("frozen")
    # its next write finds the lease gone: what it still holds is counted again
    await frozen.adjust("frozen", "a", 10)
    assert await other.usage() == {"a": 110, "b": 50}
    assert await frozen.has_lease("frozen")
    assert frozen.health.lease_reacquired == {"lease_lost": 1}
    assert frozen.health.fenced_ops == 1
    # and the stale lease token can never write again
    await frozen.release("frozen", "b", 50)
    assert await other.usage() == {"a": 110}


async def test_reserve_after_the_lease_was_reaped_counts_old_and_new(
    two_clients: tuple[RedisStore, RedisStore],
) -> None:
    store, reaper = two_clients
    await store.heartbeat("g", 0.2)
    assert (await store.reserve("g", "a", 100, LIMITS)).ok
    await asyncio.sleep(0.3)
    assert await reaper.reap() == 100
    # the next reservation first re-registers the 100 still running, then checks limits
    tight = ReserveLimits(150, 10_000, 0, 10_000, 10_000)
    refused = await store.reserve("g", "a", 100, tight)
    assert (refused.ok, refused.reason) == (False, "total")
    assert await reaper.usage() == {"a": 100}
    assert (await store.reserve("g", "a", 50, tight)).ok
    assert await reaper.usage() == {"a": 150}


@pytest.mark.parametrize("before", ["nothing", "lease_lost", "failed_write"])
async def test_a_write_cancelled_at_any_point_is_counted_right_after_the_heartbeat(
    two_clients: tuple[RedisStore, RedisStore], before: str
) -> None:
    """A client that leaves cancels its handler, the release in its ``finally`` included:
    whichever await the cancellation lands on, the store must end up counting exactly what
    the gateway still holds (here: it was flaky as a 302-token leak in a frozen-gateway
    test, where a release was cut off while re-acquiring the lease)."""
    store, other = two_clients
    await store.heartbeat("g", 30)
    for steps in range(1, 31):  # cancel after 1, 2, ... event-loop turns (once begun)
        assert (await store.reserve("g", "keep", 7, LIMITS)).ok
        assert (await store.reserve("g", "a", 302, LIMITS)).ok
        if before == "lease_lost":  # the next write is fenced and must re-acquire
            await other._client.delete("kvgate:quota:lease:g")
        elif before == "failed_write":  # as after a timeout: reconcile before writing
            store._stale.add("g")
        reserved = False
        for write in (store.release("g", "a", 302), store.reserve("g", "b", 40, LIMITS)):
            task = asyncio.ensure_future(write)
            for _ in range(steps):
                await asyncio.sleep(0)
            task.cancel()
            try:
                outcome = await task
            except asyncio.CancelledError:
                continue
            reserved = reserved or bool(outcome and outcome.ok)  # it finished first
        # the release was under way: "a" is gone; "b" only if its reservation finished
        expected = {"keep": 7 * steps, **({"b": 40} if reserved else {})}
        assert store.held("g") == expected, steps
        await store.heartbeat("g", 30)
        assert await other.usage() == expected, steps
        if reserved:
            await store.release("g", "b", 40)


async def test_heartbeat_re_registers_after_a_redis_restart(fresh_redis_server: Any) -> None:
    store = redis_store(fresh_redis_server)
    try:
        await store.heartbeat("g", 30)
        assert (await store.reserve("g", "a", 300, LIMITS)).ok
        fresh_redis_server.stop()
        with pytest.raises(StoreUnavailable):
            await store.usage()
        # a release while Redis is away is kept and reconciled, not lost or replayed twice
        await store.release("g", "a", 100)
        fresh_redis_server.start()  # empty: no persistence
        await wait_up(store)
        await store.heartbeat("g", 30)
        assert await store.usage() == {"a": 200}
        assert store.health.transitions == {"down": 1, "up": 1}
        assert store.health.lease_reacquired == {"reconcile": 1}
    finally:
        await store.close()


async def test_one_outage_is_one_down_and_one_up_transition(fresh_redis_server: Any) -> None:
    store = redis_store(fresh_redis_server)
    try:
        await store.heartbeat("g", 30)
        # many connections in the pool, all of which break with the restart
        await asyncio.gather(*(store.reserve("g", "a", 1, LIMITS) for _ in range(20)))
        fresh_redis_server.stop()
        fresh_redis_server.start()
        results = await asyncio.gather(
            *(store.reserve("g", "a", 1, LIMITS) for _ in range(20)), return_exceptions=True
        )
        assert any(isinstance(r, StoreUnavailable) for r in results)
        # while recovering, calls fail at once without flapping the state
        seen = []
        for _ in range(40):
            try:
                await store.usage()
                seen.append(True)
            except StoreUnavailable:
                seen.append(False)
            await asyncio.sleep(0.02)
        assert seen[-1] and seen == sorted(seen)  # down ... down, then up for good
        assert store.health.transitions == {"down": 1, "up": 1}
    finally:
        await store.close()


async def wait_up(store: RedisStore, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            await store.usage()
            return
        except StoreUnavailable:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.02)
