"""The store interface every backend implements (memory, Redis, etcd, composite).

Two halves:

* a key/value half with leases and prefix watches, for configuration, quotas, flags and
  the node registry (DESIGN key layout, ``kvgate.store.keys``);
* a counter half for quota reservations (hot path), ``Store``: the admission layer
  computes the limits, the store does the atomic check-and-increment against them.

All methods are coroutines. ``MemoryStore``'s never suspend, so the virtual-time
simulator drives them with ``kvgate.clock.run_now``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvgate.store.errors import StoreUnavailable

if TYPE_CHECKING:
    from kvgate.store.health import StoreHealth


@dataclass(frozen=True, slots=True)
class WatchEvent:
    key: str
    value: str | None  # None: the key was deleted or its lease expired


class KVStore(ABC):
    @abstractmethod
    async def get(self, key: str) -> str | None: ...

    @abstractmethod
    async def put(self, key: str, value: str, ttl: float | None = None) -> None:
        """Write a key; with ``ttl`` it is held under a lease and vanishes unless rewritten."""

    @abstractmethod
    async def delete(self, key: str) -> bool: ...

    @abstractmethod
    async def get_prefix(self, prefix: str) -> dict[str, str]: ...

    @abstractmethod
    def watch_prefix(self, prefix: str) -> AsyncIterator[WatchEvent]:
        """Yield changes under ``prefix`` until the iterator is closed."""

    async def close(self) -> None:
        return None

    def healths(self) -> list[StoreHealth]:
        """Up/down state of each server behind this store (none for in-process stores)."""
        return []


@dataclass(frozen=True, slots=True)
class ReserveLimits:
    """Limits for one reservation, computed by the shared Python policy (admission.quota).

    The store only does the atomic check-and-increment against them:
    tenant_used + n <= tenant_cap; global_used + n <= total; and the part of n above the
    tenant's guarantee must fit both the cluster elastic pool (total minus all
    guarantees) and the tenant's elastic limit (its weighted share when others wait).
    """

    total: int
    tenant_cap: int
    guaranteed: int
    elastic_pool: int
    tenant_elastic_limit: int


@dataclass(frozen=True, slots=True)
class ReserveOutcome:
    ok: bool
    reason: str  # within_guarantee | elastic | total | tenant_cap | elastic_pool | tenant_share


def check_reserve(
    tokens: int,
    tenant_used: int,
    global_used: int,
    elastic_used: int,
    limits: ReserveLimits,
) -> ReserveOutcome:
    """The check the Lua script mirrors (reserve.lua); MemoryStore calls this directly."""
    if tenant_used + tokens > limits.tenant_cap:
        return ReserveOutcome(False, "tenant_cap")
    if global_used + tokens > limits.total:
        return ReserveOutcome(False, "total")
    g = limits.guaranteed
    over_before = max(0, tenant_used - g)
    over_after = max(0, tenant_used + tokens - g)
    extra = over_after - over_before
    if extra == 0:
        return ReserveOutcome(True, "within_guarantee")
    if elastic_used + extra > limits.elastic_pool:
        return ReserveOutcome(False, "elastic_pool")
    if over_after > limits.tenant_elastic_limit:
        return ReserveOutcome(False, "tenant_share")
    return ReserveOutcome(True, "elastic")


class Store(KVStore):
    """A KVStore with the admission counter half."""

    url: str = ""

    @abstractmethod
    async def set_guarantees(self, guarantees: Mapping[str, int]) -> None:
        """Tell the store each tenant's guarantee (for the elastic-pool accounting)."""

    @abstractmethod
    async def reserve(
        self, gateway_id: str, tenant: str, tokens: int, limits: ReserveLimits
    ) -> ReserveOutcome: ...

    @abstractmethod
    async def release(self, gateway_id: str, tenant: str, tokens: int) -> None:
        """Return tokens (never more than this gateway holds for the tenant)."""

    @abstractmethod
    async def adjust(self, gateway_id: str, tenant: str, delta: int) -> None:
        """Grow (or shrink) a held reservation without a limit check (the stream flows)."""

    @abstractmethod
    async def usage(self) -> dict[str, int]:
        """Tokens held per tenant, all gateways together."""

    @abstractmethod
    async def heartbeat(self, gateway_id: str, ttl_s: float) -> None:
        """Refresh this gateway's lease on its reservations."""

    @abstractmethod
    async def has_lease(self, gateway_id: str) -> bool:
        """Whether this gateway's lease (and so its reservations) is still alive."""

    @abstractmethod
    async def reap(self) -> int:
        """Return the reservations of gateways whose lease expired; tokens reclaimed."""


__all__ = [
    "KVStore",
    "ReserveLimits",
    "ReserveOutcome",
    "Store",
    "StoreUnavailable",
    "WatchEvent",
    "check_reserve",
]
