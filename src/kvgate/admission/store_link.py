"""The admission layer's link to its stores: the shared one and the injected local fallback.

Reservations go to the shared store while it answers. When it does not, the failure mode
decides: ``fail-closed`` refuses, ``fail-open-local`` reserves against a share of the
total in the local store. Releases the shared store missed are replayed when it is back
(unless the lease that held them died with it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field

from kvgate.admission.metrics import AdmissionMetrics
from kvgate.store import ReserveLimits, ReserveOutcome, Store
from kvgate.store.base import StoreUnavailable

log = logging.getLogger("kvgate.admission")

STORE_ERRORS = (StoreUnavailable, ConnectionError, OSError)


@dataclass(eq=False)
class StoreLink:
    store: Store
    local: Store
    _: KW_ONLY
    gateway_id: str
    fail_closed: bool
    metrics: AdmissionMetrics
    up: bool = field(default=True, init=False)
    # shared usage per tenant, refreshed + tracked
    usage: dict[str, int] = field(default_factory=dict, init=False)
    # releases the store missed while down
    _unreturned: dict[str, int] = field(default_factory=dict, init=False, repr=False)

    def mark(self, up: bool, error: BaseException | None = None) -> None:
        if up == self.up:
            return
        self.up = up
        self.metrics.store_up.set(1 if up else 0)
        if up:
            log.warning("store %s reachable again: global accounting resumed", self.store.url)
        else:
            log.warning(
                "store %s unreachable (%s): %s",
                self.store.url,
                type(error).__name__ if error else "error",
                "rejecting (fail-closed)" if self.fail_closed else "serving on the local share",
            )

    async def reserve(
        self,
        tenant: str,
        tokens: int,
        limits: Callable[[int], ReserveLimits],
        total: int,
        local_total: int,
    ) -> tuple[ReserveOutcome, bool]:
        """(outcome, local): reserve in the shared store, else per the failure mode.

        ``limits(total)`` gives the reservation's limits against a cluster total.
        """
        if self.up:
            try:
                outcome = await self.store.reserve(self.gateway_id, tenant, tokens, limits(total))
                if outcome.ok:
                    self.usage[tenant] = self.usage.get(tenant, 0) + tokens
                return outcome, False
            except STORE_ERRORS as exc:
                self.mark(False, exc)
        if self.fail_closed:
            return ReserveOutcome(False, "store_unavailable"), False
        outcome = await self.local.reserve(self.gateway_id, tenant, tokens, limits(local_total))
        return outcome, True

    async def publish_guarantees(self, guarantees: dict[str, int]) -> None:
        """Tell both stores each tenant's guarantee (the elastic-pool accounting needs it)."""
        await self.local.set_guarantees(guarantees)
        try:
            await self.store.set_guarantees(guarantees)
        except STORE_ERRORS as exc:
            self.mark(False, exc)

    async def give_back(self, tenant: str, tokens: int, local: bool) -> None:
        """Return a reservation; a release the shared store missed is replayed later."""
        if local:
            await self.local.release(self.gateway_id, tenant, tokens)
            return
        self.usage[tenant] = max(0, self.usage.get(tenant, 0) - tokens)
        try:
            await self.store.release(self.gateway_id, tenant, tokens)
        except STORE_ERRORS as exc:
            self.mark(False, exc)
            # replayed on recovery (bounded by what we hold, so harmless if the store
            # restarted empty); otherwise our live lease would keep these tokens
            self._unreturned[tenant] = self._unreturned.get(tenant, 0) + tokens

    async def upkeep(self, ttl_s: float, guarantees: dict[str, int]) -> None:
        """Heartbeat the lease, replay missed releases, reap dead gateways, refresh usage."""
        try:
            if self._unreturned and not await self.store.has_lease(self.gateway_id):
                self._unreturned.clear()  # the store lost or reaped what we held
            await self.store.heartbeat(self.gateway_id, ttl_s)
            if not self.up:
                await self.store.set_guarantees(guarantees)
            while self._unreturned:
                tenant, tokens = next(iter(self._unreturned.items()))
                await self.store.release(self.gateway_id, tenant, tokens)
                del self._unreturned[tenant]
            reclaimed = await self.store.reap()
            if reclaimed:
                self.metrics.reclaimed.inc(reclaimed)
                log.warning("reclaimed %d tokens from expired gateway leases", reclaimed)
            self.usage = await self.store.usage()
            self.mark(True)
        except STORE_ERRORS as exc:
            self.mark(False, exc)

    async def all_usage(self) -> dict[str, int]:
        """Usage per tenant: the shared store's (while up) plus the local fallback's."""
        usage = dict(self.usage) if self.up else {}
        for tenant, used in (await self.local.usage()).items():
            usage[tenant] = usage.get(tenant, 0) + used
        return usage
