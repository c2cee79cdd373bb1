"""The embedded store (one process). Its coroutines never suspend except ``watch_prefix``.

The simulator drives it with ``kvgate.clock.run_now``; TTLs follow the injected clock.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator, Mapping

from kvgate.clock import Clock, SystemClock
from kvgate.store.base import ReserveLimits, ReserveOutcome, Store, WatchEvent, check_reserve


class MemoryStore(Store):
    def __init__(self, clock: Clock | None = None) -> None:
        self.url = "memory://"
        self._clock = clock or SystemClock()
        self._data: dict[str, str] = {}
        self._expires: dict[str, float] = {}
        self._watchers: list[tuple[str, asyncio.Queue[WatchEvent]]] = []
        self._guarantees: dict[str, int] = {}
        self._tenant_used: dict[str, int] = defaultdict(int)
        self._held: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self._leases: dict[str, float] = {}

    # -- key/value half ----------------------------------------------------------------
    def _expire(self) -> None:
        now = self._clock.now()
        for key in [k for k, t in self._expires.items() if t <= now]:
            del self._expires[key]
            if self._data.pop(key, None) is not None:
                self._notify(WatchEvent(key, None))

    def _next_expiry_in(self) -> float | None:
        if not self._expires:
            return None
        return max(0.0, min(self._expires.values()) - self._clock.now())

    def _notify(self, event: WatchEvent) -> None:
        for prefix, queue in self._watchers:
            if event.key.startswith(prefix):
                queue.put_nowait(event)

    async def get(self, key: str) -> str | None:
        self._expire()
        return self._data.get(key)

    async def put(self, key: str, value: str, ttl: float | None = None) -> None:
        self._expire()
        self._data[key] = value
        if ttl is None:
            self._expires.pop(key, None)
        else:
            self._expires[key] = self._clock.now() + ttl
        self._notify(WatchEvent(key, value))

    async def delete(self, key: str) -> bool:
        self._expire()
        self._expires.pop(key, None)
        existed = self._data.pop(key, None) is not None
        if existed:
            self._notify(WatchEvent(key, None))
        return existed

    async def get_prefix(self, prefix: str) -> dict[str, str]:
        self._expire()
        return {k: v for k, v in self._data.items() if k.startswith(prefix)}

    async def watch_prefix(self, prefix: str) -> AsyncIterator[WatchEvent]:
        queue: asyncio.Queue[WatchEvent] = asyncio.Queue()
        entry = (prefix, queue)
        self._watchers.append(entry)
        try:
            while True:
                wait = self._next_expiry_in()
                try:
                    # wake at the next lease expiry so deletions are pushed, not just polled
                    event = await asyncio.wait_for(
                        queue.get(), timeout=None if wait is None else wait + 0.01
                    )
                except TimeoutError:
                    self._expire()
                    continue
                yield event
        finally:
            self._watchers.remove(entry)

    # -- counter half ------------------------------------------------------------------
    def _reap_now(self) -> int:
        now = self._clock.now()
        reclaimed = 0
        for gid in [g for g, t in self._leases.items() if t <= now]:
            del self._leases[gid]
            for tenant, tokens in self._held.pop(gid, {}).items():
                self._tenant_used[tenant] -= tokens
                reclaimed += tokens
        return reclaimed

    def _elastic_used(self) -> int:
        return sum(
            max(0, used - self._guarantees.get(t, 0)) for t, used in self._tenant_used.items()
        )

    async def set_guarantees(self, guarantees: Mapping[str, int]) -> None:
        self._guarantees = dict(guarantees)

    async def reserve(
        self, gateway_id: str, tenant: str, tokens: int, limits: ReserveLimits
    ) -> ReserveOutcome:
        self._reap_now()
        outcome = check_reserve(
            tokens,
            self._tenant_used[tenant],
            sum(self._tenant_used.values()),
            self._elastic_used(),
            limits,
        )
        if outcome.ok:
            self._tenant_used[tenant] += tokens
            self._held[gateway_id][tenant] += tokens
        return outcome

    async def release(self, gateway_id: str, tenant: str, tokens: int) -> None:
        held = self._held.get(gateway_id, {})
        amount = min(tokens, held.get(tenant, 0))
        if amount <= 0:
            return
        held[tenant] -= amount
        self._tenant_used[tenant] -= amount

    async def adjust(self, gateway_id: str, tenant: str, delta: int) -> None:
        if delta < 0:
            await self.release(gateway_id, tenant, -delta)
            return
        self._held[gateway_id][tenant] += delta
        self._tenant_used[tenant] += delta

    async def usage(self) -> dict[str, int]:
        self._reap_now()
        return {t: u for t, u in self._tenant_used.items() if u}

    async def heartbeat(self, gateway_id: str, ttl_s: float) -> None:
        self._leases[gateway_id] = self._clock.now() + ttl_s

    async def has_lease(self, gateway_id: str) -> bool:
        return self._leases.get(gateway_id, float("-inf")) > self._clock.now()

    async def reap(self) -> int:
        return self._reap_now()
