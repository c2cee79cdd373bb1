"""redis:// store: hot quota counters as atomic Lua scripts, reservations under leases.

Each gateway's reservations are tracked in its own hash and covered by a lease key it
refreshes by heartbeat; any gateway's ``reap()`` returns the tokens of a gateway whose
lease expired (a crashed gateway's tokens come back within the lease TTL).
The key/value half mirrors the DESIGN layout; TTL keys use PX expiry, and watches poll.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from kvgate.store import ReserveLimits, ReserveOutcome, Store
from kvgate.store.base import StoreUnavailable, WatchEvent

T = TypeVar("T")
LUA_DIR = Path(__file__).with_name("lua")
Q = "kvgate:quota:"
USED, GUARANTEED, GATEWAYS = f"{Q}used", f"{Q}guaranteed", f"{Q}gateways"
WATCH_POLL_S = 0.25
DEFAULT_LEASE_MS = 10_000


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _script(name: str) -> str:
    return (LUA_DIR / f"{name}.lua").read_text()


class RedisStore(Store):
    def __init__(self, url: str, *, timeout_s: float = 1.0) -> None:
        parsed = urlparse(url)
        if not parsed.hostname:
            raise ValueError(f"store: redis URL needs a host, got {url!r}")
        self.url = url
        self._client = aioredis.Redis(
            host=parsed.hostname,
            port=parsed.port or 6379,
            db=int(parsed.path.strip("/") or 0),
            password=parsed.password,
            ssl=parsed.scheme == "rediss",
            decode_responses=True,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
        )
        self._reserve = self._client.register_script(_script("reserve"))
        self._release = self._client.register_script(_script("release"))
        self._adjust = self._client.register_script(_script("adjust"))
        self._reap = self._client.register_script(_script("reap"))
        self._lease_ms: dict[str, int] = {}

    async def _call(self, fn: Callable[[], Awaitable[T]]) -> T:
        try:
            return await fn()
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
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
        gw, lease = self._gw(gateway_id)
        args: list[Any] = [
            tenant,
            tokens,
            limits.total,
            limits.tenant_cap,
            limits.guaranteed,
            limits.elastic_pool,
            limits.tenant_elastic_limit,
            gateway_id,
            self._lease_ms.get(gateway_id, DEFAULT_LEASE_MS),
        ]
        ok, reason = await self._call(
            lambda: self._reserve(keys=[USED, GUARANTEED, gw, GATEWAYS, lease], args=args)
        )
        return ReserveOutcome(bool(int(ok)), str(reason))

    async def release(self, gateway_id: str, tenant: str, tokens: int) -> None:
        gw, _ = self._gw(gateway_id)
        await self._call(lambda: self._release(keys=[USED, gw], args=[tenant, tokens]))

    async def adjust(self, gateway_id: str, tenant: str, delta: int) -> None:
        if delta < 0:
            await self.release(gateway_id, tenant, -delta)
            return
        gw, lease = self._gw(gateway_id)
        ttl = self._lease_ms.get(gateway_id, DEFAULT_LEASE_MS)
        await self._call(
            lambda: self._adjust(
                keys=[USED, gw, GATEWAYS, lease], args=[tenant, delta, gateway_id, ttl]
            )
        )

    async def usage(self) -> dict[str, int]:
        raw = await self._call(lambda: self._client.hgetall(USED))
        return {_text(k): int(v) for k, v in raw.items() if int(v) > 0}

    async def heartbeat(self, gateway_id: str, ttl_s: float) -> None:
        ttl_ms = max(1, int(ttl_s * 1000))
        self._lease_ms[gateway_id] = ttl_ms
        _, lease = self._gw(gateway_id)

        async def beat() -> None:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.set(lease, "1", px=ttl_ms)
                pipe.sadd(GATEWAYS, gateway_id)
                await pipe.execute()

        await self._call(beat)

    async def has_lease(self, gateway_id: str) -> bool:
        _, lease = self._gw(gateway_id)
        return bool(await self._call(lambda: self._client.exists(lease)))

    async def reap(self) -> int:
        return int(await self._call(lambda: self._reap(keys=[GATEWAYS, USED], args=[Q])))


__all__ = ["RedisStore"]
