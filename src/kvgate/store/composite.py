"""``redis://…,etcd://…``: Redis for the hot counters, etcd for configuration and registry."""

from __future__ import annotations

from collections.abc import AsyncIterator

from kvgate.store.base import KVStore, Store, WatchEvent
from kvgate.store.forwarded import ForwardedCounters
from kvgate.store.health import StoreHealth


class CompositeStore(ForwardedCounters):
    def __init__(self, counters: Store, config: KVStore) -> None:
        self.counters = counters
        self.config = config
        config_url = getattr(config, "url", type(config).__name__)
        self.url = config_url if counters.url == "memory://" else f"{counters.url},{config_url}"

    async def get(self, key: str) -> str | None:
        return await self.config.get(key)

    async def put(self, key: str, value: str, ttl: float | None = None) -> None:
        await self.config.put(key, value, ttl)

    async def delete(self, key: str) -> bool:
        return await self.config.delete(key)

    async def get_prefix(self, prefix: str) -> dict[str, str]:
        return await self.config.get_prefix(prefix)

    def watch_prefix(self, prefix: str) -> AsyncIterator[WatchEvent]:
        return self.config.watch_prefix(prefix)

    async def close(self) -> None:
        await self.counters.close()
        await self.config.close()

    def healths(self) -> list[StoreHealth]:
        return self.counters.healths() + self.config.healths()
