"""Stores behind one interface: memory:// (default), redis://, etcd://, or "redis://…,etcd://…".

``Store`` extends ``KVStore`` (config, leases, watches) with the counter half used by
admission: atomic reserve/release/adjust of runtime tokens per tenant, held per gateway
under a lease so a crashed gateway's tokens return within the lease TTL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvgate.store.base import (
    KVStore,
    ReserveLimits,
    ReserveOutcome,
    Store,
    StoreUnavailable,
    WatchEvent,
    check_reserve,
)

if TYPE_CHECKING:
    from kvgate.clock import Clock


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
