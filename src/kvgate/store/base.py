"""The store interface every backend implements (memory, Redis, etcd, composite).

Two halves:

* a key/value half with leases and prefix watches, for configuration, quotas, flags and
  the node registry (DESIGN key layout, ``kvgate.store.keys``);
* a counter half for quota reservations (hot path), defined by the admission layer.

All methods are coroutines. ``MemoryStore``'s never suspend, so the virtual-time
simulator drives them with ``kvgate.clock.run_now``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvgate.store.health import StoreHealth


@dataclass(frozen=True, slots=True)
class WatchEvent:
    key: str
    value: str | None  # None: the key was deleted or its lease expired


class StoreUnavailable(ConnectionError):
    """The backing server cannot be reached; callers fall back (fail-open-local/closed)."""


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
