"""``redis://…,etcd://…``: Redis for the hot counters, etcd for configuration and registry."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

from kvgate.store import ReserveLimits, ReserveOutcome, Store
from kvgate.store.base import KVStore, WatchEvent
from kvgate.store.health import StoreHealth


class CompositeStore(Store):
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

    async def set_guarantees(self, guarantees: Mapping[str, int]) -> None:
        await self.counters.set_guarantees(guarantees)

    async def reserve(
        self, gateway_id: str, tenant: str, tokens: int, limits: ReserveLimits
    ) -> ReserveOutcome:
        return await self.counters.reserve(gateway_id, tenant, tokens, limits)

    async def release(self, gateway_id: str, tenant: str, tokens: int) -> None:
        await self.counters.release(gateway_id, tenant, tokens)

    async def adjust(self, gateway_id: str, tenant: str, delta: int) -> None:
        await self.counters.adjust(gateway_id, tenant, delta)

    async def usage(self) -> dict[str, int]:
        return await self.counters.usage()

    async def heartbeat(self, gateway_id: str, ttl_s: float) -> None:
        await self.counters.heartbeat(gateway_id, ttl_s)

    async def has_lease(self, gateway_id: str) -> bool:
        return await self.counters.has_lease(gateway_id)

    async def reap(self) -> int:
        return await self.counters.reap()
