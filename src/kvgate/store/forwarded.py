"""A store whose counter half is another store's (composite and etcd stores)."""

from __future__ import annotations

from collections.abc import Mapping

from kvgate.store.base import ReserveLimits, ReserveOutcome, Store


class ForwardedCounters(Store):
    """Forwards the admission counter half to ``self.counters``; subclasses set it."""

    counters: Store

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
