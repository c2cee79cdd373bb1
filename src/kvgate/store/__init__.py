"""Stores behind one interface: memory:// (default), redis://, etcd://, or "redis://…,etcd://…".

``Store`` extends ``KVStore`` (config, leases, watches) with the counter half used by
admission: atomic reserve/release/adjust of runtime tokens per tenant, held per gateway
under a lease so a crashed gateway's tokens return within the lease TTL.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvgate.store.base import KVStore, StoreUnavailable, WatchEvent

if TYPE_CHECKING:
    from kvgate.clock import Clock


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


def open_store(url: str, *, clock: Clock | None = None) -> Store:
    """memory://, redis://host:port, etcd://host:port, or "redis://…,etcd://…".

    ``clock`` drives the leases and TTLs of a memory:// store (the simulator passes its
    virtual clock); remote stores keep time on the server.
    """
    parts = [p.strip() for p in url.split(",") if p.strip()]
    if len(parts) == 2:
        from kvgate.store.composite import CompositeStore

        by_scheme = {p.split("://", 1)[0]: p for p in parts}
        counters = by_scheme.get("redis") or by_scheme.get("rediss")
        config = by_scheme.get("etcd")
        if counters is None or config is None:
            raise ValueError(f"store pair must be redis://…,etcd://…, got {url!r}")
        return CompositeStore(_open_one(counters, clock), _open_one(config, clock))
    if len(parts) != 1:
        raise ValueError(f"store: expected one URL or a redis+etcd pair, got {url!r}")
    return _open_one(parts[0], clock)


def with_counters(store: KVStore, *, clock: Clock | None = None) -> Store:
    """``store`` itself when it has the counter half, else it with in-process counters."""
    if isinstance(store, Store):
        return store
    from kvgate.store.composite import CompositeStore

    return CompositeStore(open_store("memory://", clock=clock), store)


def _open_one(url: str, clock: Clock | None = None) -> Store:
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme == "memory":
        from kvgate.store.memory import MemoryStore

        return MemoryStore(clock)
    if scheme in ("redis", "rediss"):
        from kvgate.store.redis_store import RedisStore

        return RedisStore(url)
    if scheme == "etcd":
        from kvgate.store.etcd_store import EtcdStore

        return EtcdStore(url)
    raise ValueError(f"store: unknown URL {url!r}; use memory://, redis://host:port or etcd://")


__all__ = [
    "KVStore",
    "ReserveLimits",
    "ReserveOutcome",
    "Store",
    "StoreUnavailable",
    "WatchEvent",
    "check_reserve",
    "open_store",
    "with_counters",
]
