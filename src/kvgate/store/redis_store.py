"""redis:// store: hot quota counters as atomic Lua scripts, reservations under leases.

Each gateway's reservations are tracked in its own hash and covered by a lease key it
refreshes by heartbeat; any gateway's ``reap()`` returns the tokens of a gateway whose
lease expired (a crashed gateway's tokens come back within the lease TTL).

Fencing: the lease key holds an epoch token, and every counter write carries it. A
gateway whose lease expired (it was frozen, or starved, past the TTL, and another
gateway reaped it) or vanished (Redis restarted empty) gets ``lease_lost`` on its next
write or heartbeat; it then re-registers, atomically under a new epoch, exactly what it
still holds (``_held``, kept in step with every reserve/adjust/release) before any
further write, and a reservation is retried only under the new lease. So a live
gateway's running work is never silently uncounted, and a stale lease never writes.

Outages: releases and adjustments made while Redis is unreachable are kept in
``_held`` and reconciled by the same re-registration once the store is back, instead
of being lost or replayed twice. Up/down has hysteresis (``kvgate.store.health``).
The key/value half mirrors the DESIGN layout; TTL keys use PX expiry, and watches poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from kvgate.store.base import ReserveLimits, ReserveOutcome, Store, StoreUnavailable, WatchEvent
from kvgate.store.health import StoreHealth

T = TypeVar("T")
LUA_DIR = Path(__file__).with_name("lua")
Q = "kvgate:quota:"
USED, GUARANTEED, GATEWAYS = f"{Q}used", f"{Q}guaranteed", f"{Q}gateways"
WATCH_POLL_S = 0.25
DEFAULT_LEASE_MS = 10_000
LEASE_LOST = "lease_lost"
log = logging.getLogger("kvgate.store")


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _script(name: str) -> str:
    return (LUA_DIR / f"{name}.lua").read_text()


class _Gate:
    """Counter writes run side by side; a re-registration runs alone (waits for them)."""

    def __init__(self) -> None:
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._exclusive = False
        self._open = asyncio.Event()
        self._open.set()

    @contextlib.asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        while self._exclusive:
            await self._open.wait()
        self._active += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._active -= 1
            if not self._active:
                self._idle.set()

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        while self._exclusive:
            await self._open.wait()
        self._exclusive = True
        self._open.clear()
        try:
            await self._idle.wait()
            yield
        finally:
            self._exclusive = False
            self._open.set()


# Connections one gateway keeps to Redis (each admission decision holds one briefly).
MAX_CONNECTIONS = 64


class RedisStore(Store):
    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 1.0,
        recover_after_s: float | None = None,
        probe_interval_s: float | None = None,
    ) -> None:
        parsed = urlparse(url)
        if not parsed.hostname:
            raise ValueError(f"store: redis URL needs a host, got {url!r}")
        self.url = url
        # A blocking pool: under a burst, callers wait (up to timeout_s) for a free
        # connection. A pool that refuses instead ("Too many connections") looks like an
        # outage to the health tracker, which then drops every connection in use.
        pool = aioredis.BlockingConnectionPool(
            max_connections=MAX_CONNECTIONS,
            timeout=timeout_s,
            connection_class=(
                aioredis.SSLConnection if parsed.scheme == "rediss" else aioredis.Connection
            ),
            host=parsed.hostname,
            port=parsed.port or 6379,
            db=int(parsed.path.strip("/") or 0),
            password=parsed.password,
            decode_responses=True,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
        )
        self._client = aioredis.Redis(connection_pool=pool)
        self._reserve = self._client.register_script(_script("reserve"))
        self._release = self._client.register_script(_script("release"))
        self._adjust = self._client.register_script(_script("adjust"))
        self._reap = self._client.register_script(_script("reap"))
        self._renew = self._client.register_script(_script("renew"))
        self._acquire = self._client.register_script(_script("acquire"))
        self.health = StoreHealth("redis", url)
        if recover_after_s is not None:
            self.health.recover_after_s = recover_after_s
        if probe_interval_s is not None:
            self.health.probe_interval_s = probe_interval_s
        self._lease_ms: dict[str, int] = {}
        self._epoch: dict[str, str] = {}  # gateway id → token of the lease it holds
        self._held: dict[str, dict[str, int]] = {}  # gateway id → tenant → tokens held
        self._stale: set[str] = set()  # gateways whose counted state may differ from _held
        self._version: dict[str, int] = {}  # changes of _held, to spot one during a re-register
        self._gates: dict[str, _Gate] = {}

    def healths(self) -> list[StoreHealth]:
        return [self.health]

    async def _call(self, fn: Callable[[], Awaitable[T]]) -> T:
        await self.health.check(self._client.ping)
        try:
            return await fn()
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            self.health.failed(exc)
            self._stale.update(self._epoch)  # a write may or may not have landed
            # drop every pooled connection now, so the next ones are fresh and a
            # restarted server does not fail once per stale connection
            with contextlib.suppress(Exception):
                await self._client.connection_pool.disconnect()
            raise StoreUnavailable(f"redis at {self.url}: {exc}") from exc

    # -- key/value half ----------------------------------------------------------------
    async def get(self, key: str) -> str | None:
        value = await self._call(lambda: self._client.get(key))
        return None if value is None else _text(value)

    async def put(self, key: str, value: str, ttl: float | None = None) -> None:
        px = None if ttl is None else max(1, int(ttl * 1000))
        await self._call(lambda: self._client.set(key, value, px=px))

    async def delete(self, key: str) -> bool:
        return bool(await self._call(lambda: self._client.delete(key)))

    async def get_prefix(self, prefix: str) -> dict[str, str]:
        async def scan() -> dict[str, str]:
            pattern = "".join(f"[{c}]" if c in "*?[]\\" else c for c in prefix) + "*"
            keys = [k async for k in self._client.scan_iter(match=pattern, count=500)]
            if not keys:
                return {}
            values = await self._client.mget(keys)
            pairs = zip(keys, values, strict=True)
            return {_text(k): _text(v) for k, v in pairs if v is not None}

        return await self._call(scan)

    async def watch_prefix(self, prefix: str) -> AsyncIterator[WatchEvent]:
        """Changes under the prefix, by polling (values are small and few)."""
        seen = await self.get_prefix(prefix)
        while True:
            await asyncio.sleep(WATCH_POLL_S)
            now = await self.get_prefix(prefix)
            for key, value in now.items():
                if seen.get(key) != value:
                    yield WatchEvent(key, value)
            for key in seen.keys() - now.keys():
                yield WatchEvent(key, None)
            seen = now

    async def close(self) -> None:
        await self._client.aclose()

    # -- counter half ------------------------------------------------------------------
    def _gw(self, gateway_id: str) -> tuple[str, str]:
        return f"{Q}gw:{gateway_id}", f"{Q}lease:{gateway_id}"

    def _gate(self, gateway_id: str) -> _Gate:
        gate = self._gates.get(gateway_id)
        if gate is None:
            gate = self._gates[gateway_id] = _Gate()
        return gate

    def _hold(self, gateway_id: str, tenant: str, delta: int) -> None:
        self._version[gateway_id] = self._version.get(gateway_id, 0) + 1
        held = self._held.setdefault(gateway_id, {})
        left = held.get(tenant, 0) + delta
        if left > 0:
            held[tenant] = left
        else:
            held.pop(tenant, None)

    def held(self, gateway_id: str) -> dict[str, int]:
        """What this process holds for the gateway (what it re-registers on a new lease)."""
        return dict(self._held.get(gateway_id, {}))

    async def _reacquire(self, gateway_id: str, reason: str, epoch_seen: str | None) -> None:
        """Take a new lease and count exactly ``_held`` under it (waits for writes in flight)."""
        async with self._gate(gateway_id).exclusive():
            if self._epoch.get(gateway_id) != epoch_seen:
                return  # another caller re-registered meanwhile
            epoch = uuid.uuid4().hex
            gw, lease = self._gw(gateway_id)
            version = self._version.get(gateway_id, 0)
            held = self._held.get(gateway_id, {})
            args: list[Any] = [gateway_id, self._lease_ms.get(gateway_id, DEFAULT_LEASE_MS), epoch]
            for tenant, tokens in held.items():
                args += [tenant, tokens]
            counted = await self._call(
                lambda: self._acquire(keys=[USED, gw, GATEWAYS, lease], args=args)
            )
            self._epoch[gateway_id] = epoch
            if self._version.get(gateway_id, 0) == version:  # else: a write failed meanwhile
                self._stale.discard(gateway_id)
            if epoch_seen is not None:
                self.health.reacquired(reason)
                log.warning(
                    "lease of %s re-acquired (%s): %s tokens still running re-registered",
                    gateway_id,
                    reason,
                    counted,
                )

    async def _ensure_lease(self, gateway_id: str) -> str:
        if gateway_id not in self._epoch:
            await self._reacquire(gateway_id, "new", None)
        elif gateway_id in self._stale:
            await self._reacquire(gateway_id, "reconcile", self._epoch[gateway_id])
        return self._epoch[gateway_id]

    async def set_guarantees(self, guarantees: Mapping[str, int]) -> None:
        async def write() -> None:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.delete(GUARANTEED)
                if guarantees:
                    pipe.hset(GUARANTEED, mapping={k: int(v) for k, v in guarantees.items()})
                await pipe.execute()

        await self._call(write)

    async def reserve(
        self, gateway_id: str, tenant: str, tokens: int, limits: ReserveLimits
    ) -> ReserveOutcome:
        for _ in range(2):  # a second time only under a freshly re-acquired lease
            await self._ensure_lease(gateway_id)
            outcome, epoch = await self._reserve_under_lease(gateway_id, tenant, tokens, limits)
            if outcome.reason != LEASE_LOST:
                return outcome
            self.health.fenced_ops += 1
            await self._reacquire(gateway_id, LEASE_LOST, epoch)
        return ReserveOutcome(False, LEASE_LOST)

    async def _reserve_under_lease(
        self, gateway_id: str, tenant: str, tokens: int, limits: ReserveLimits
    ) -> tuple[ReserveOutcome, str]:
        gw, lease = self._gw(gateway_id)
        async with self._gate(gateway_id).shared():  # the epoch cannot change in here
            epoch = self._epoch[gateway_id]
            args: list[Any] = [
                tenant,
                tokens,
                limits.total,
                limits.tenant_cap,
                limits.guaranteed,
                limits.elastic_pool,
                limits.tenant_elastic_limit,
                gateway_id,
                epoch,
            ]
            try:
                ok, reason = await self._call(
                    lambda: self._reserve(keys=[USED, GUARANTEED, gw, GATEWAYS, lease], args=args)
                )
            except asyncio.CancelledError:  # the script may have run: count ``_held`` again
                self._stale.add(gateway_id)
                raise
            if int(ok):
                self._hold(gateway_id, tenant, tokens)
        return ReserveOutcome(bool(int(ok)), str(reason)), epoch

    async def _counted_write(self, gateway_id: str, tenant: str, delta: int) -> None:
        """Adjust (delta > 0) or release (delta < 0). ``_held`` changes at once and the
        store follows now, or by re-registration after a lost lease or an outage."""
        gw, lease = self._gw(gateway_id)
        if delta < 0:
            delta = -min(-delta, self._held.get(gateway_id, {}).get(tenant, 0))
        if not delta:
            return
        held = False
        try:
            try:
                await self._ensure_lease(gateway_id)
            except StoreUnavailable:
                self._hold(gateway_id, tenant, delta)
                self._stale.add(gateway_id)  # reconciled when the store is back
                return
            async with self._gate(gateway_id).shared():
                self._hold(gateway_id, tenant, delta)
                held = True
                epoch = self._epoch[gateway_id]
                script = self._adjust if delta > 0 else self._release
                args: list[Any] = [tenant, abs(delta), epoch]
                try:
                    done = await self._call(lambda: script(keys=[USED, gw, lease], args=args))
                except StoreUnavailable:
                    self._stale.add(gateway_id)
                    return
        except asyncio.CancelledError:
            # The caller was cancelled (a client that left cancels its handler, release
            # included) and will not write again: the change stands in ``_held`` and the
            # next heartbeat re-registers it, whether or not the script ran.
            if not held:
                self._hold(gateway_id, tenant, delta)
            self._stale.add(gateway_id)
            raise
        if int(done) < 0:
            self.health.fenced_ops += 1
            await self._reacquire_quietly(gateway_id, epoch)

    async def _reacquire_quietly(self, gateway_id: str, epoch: str) -> None:
        try:
            await self._reacquire(gateway_id, LEASE_LOST, epoch)
        except StoreUnavailable:
            self._stale.add(gateway_id)

    async def release(self, gateway_id: str, tenant: str, tokens: int) -> None:
        await self._counted_write(gateway_id, tenant, -tokens)

    async def adjust(self, gateway_id: str, tenant: str, delta: int) -> None:
        await self._counted_write(gateway_id, tenant, delta)

    async def usage(self) -> dict[str, int]:
        raw = await self._call(lambda: self._client.hgetall(USED))
        return {_text(k): int(v) for k, v in raw.items() if int(v) > 0}

    async def heartbeat(self, gateway_id: str, ttl_s: float) -> None:
        """Renew the lease; if it is gone (expired and reaped, or Redis restarted), or
        writes were missed during an outage, re-register what is still held."""
        self._lease_ms[gateway_id] = max(1, int(ttl_s * 1000))
        epoch = self._epoch.get(gateway_id)
        if epoch is None or gateway_id in self._stale:
            await self._ensure_lease(gateway_id)
            return
        _, lease = self._gw(gateway_id)
        ttl_ms = self._lease_ms[gateway_id]
        renewed = await self._call(
            lambda: self._renew(keys=[lease, GATEWAYS], args=[epoch, ttl_ms, gateway_id])
        )
        if not int(renewed):
            await self._reacquire(gateway_id, LEASE_LOST, epoch)

    async def has_lease(self, gateway_id: str) -> bool:
        _, lease = self._gw(gateway_id)
        value = await self._call(lambda: self._client.get(lease))
        epoch = self._epoch.get(gateway_id)
        return value is not None and (epoch is None or _text(value) == epoch)

    async def reap(self) -> int:
        return int(await self._call(lambda: self._reap(keys=[GATEWAYS, USED], args=[Q])))


__all__ = ["RedisStore"]
