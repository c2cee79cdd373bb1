"""etcd:// store (etcd v3 via aetcd): configuration, quotas, flags and the node registry.

TTL keys are held under etcd leases; ``watch_prefix`` uses etcd watches, so a quota
written by an operator reaches every gateway within a watch round-trip. The counter half
is kept in process (etcd is not a hot-counter store): for shared quota counters across
gateways use ``redis://…,etcd://…``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar
from urllib.parse import urlparse

import aetcd
import aetcd.exceptions

from kvgate.store.base import StoreUnavailable, WatchEvent
from kvgate.store.forwarded import ForwardedCounters
from kvgate.store.health import StoreHealth
from kvgate.store.memory import MemoryStore

T = TypeVar("T")
PROBE_KEY = b"/kvgate/.probe"
_ERRORS = (aetcd.exceptions.ClientError, ConnectionError, OSError, TimeoutError)


class EtcdStore(ForwardedCounters):
    def __init__(self, url: str, *, timeout_s: int = 2) -> None:
        parsed = urlparse(url)
        if not parsed.hostname:
            raise ValueError(f"store: etcd URL needs a host, got {url!r}")
        self.url = url
        self._host, self._port = parsed.hostname, parsed.port or 2379
        self._timeout_s = timeout_s
        self._client: aetcd.Client | None = None
        self._connecting: asyncio.Task[aetcd.Client] | None = None
        self._revision = 0  # newest etcd revision seen
        self._loop: asyncio.AbstractEventLoop | None = None
        self.counters = MemoryStore()  # the counter half is kept in process
        self.health = StoreHealth("etcd", url)

    async def _connected(self) -> aetcd.Client:
        loop = asyncio.get_running_loop()
        if self._connecting is None or self._loop is not loop:
            # a gRPC channel belongs to one event loop; concurrent callers share one connect
            self._loop = loop
            self._connecting = loop.create_task(self._connect())
        try:
            return await asyncio.shield(self._connecting)
        except BaseException:
            if self._connecting.done():
                self._connecting = None
            raise

    async def _connect(self) -> aetcd.Client:
        client = aetcd.Client(
            host=self._host, port=self._port, timeout=self._timeout_s, connect_wait_timeout=1
        )
        await client.connect()
        self._client = client
        return client

    async def _call(self, fn: Callable[[aetcd.Client], Awaitable[T]]) -> T:
        await self.health.check(self._probe)
        try:
            return await fn(await self._connected())
        except _ERRORS as exc:
            self.health.failed(exc)
            raise StoreUnavailable(f"etcd at {self.url}: {exc}") from exc

    async def _probe(self) -> None:
        client = await self._connected()
        await client.get(PROBE_KEY)

    def healths(self) -> list[StoreHealth]:
        return [self.health]

    # -- key/value half ----------------------------------------------------------------
    async def get(self, key: str) -> str | None:
        result = await self._call(lambda c: c.get(key.encode()))
        if result is None:
            return None
        self._revision = max(self._revision, result.header.revision)
        return result.value.decode()

    async def put(self, key: str, value: str, ttl: float | None = None) -> None:
        async def write(c: aetcd.Client) -> None:
            lease = None
            if ttl is not None:
                lease = await c.lease(max(1, math.ceil(ttl)))
            await c.put(key.encode(), value.encode(), lease=lease)

        await self._call(write)

    async def delete(self, key: str) -> bool:
        result = await self._call(lambda c: c.delete(key.encode()))
        return result is not None

    async def get_prefix(self, prefix: str) -> dict[str, str]:
        result = await self._call(lambda c: c.get_prefix(prefix.encode()))
        self._revision = max(self._revision, result.header.revision)
        return {kv.key.decode(): kv.value.decode() for kv in result}

    async def watch_prefix(self, prefix: str) -> AsyncIterator[WatchEvent]:
        """Changes under the prefix after the newest revision this store has read."""
        client = await self._call(lambda c: _identity(c))
        try:
            # resume after the newest revision this store has read, so a change made
            # between a get_prefix and the watch starting is not missed
            start = self._revision + 1 if self._revision else None
            watch = await client.watch_prefix(prefix.encode(), start_revision=start)
        except _ERRORS as exc:
            self.health.failed(exc)
            raise StoreUnavailable(f"etcd watch at {self.url}: {exc}") from exc
        try:
            async for event in watch:
                deleted = event.kind == aetcd.rtypes.EventKind.DELETE
                value = None if deleted else event.kv.value.decode()
                self._revision = max(self._revision, event.kv.mod_revision)
                yield WatchEvent(event.kv.key.decode(), value)
        except _ERRORS as exc:
            self.health.failed(exc)
            raise StoreUnavailable(f"etcd watch at {self.url}: {exc}") from exc
        finally:
            cancel = getattr(watch, "cancel", None)
            if cancel is not None:
                with contextlib.suppress(*_ERRORS, RuntimeError):
                    await cancel()

    async def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(*_ERRORS):
                await self._client.close()
            self._client = None
        self._connecting = None


async def _identity(client: aetcd.Client) -> aetcd.Client:
    return client
