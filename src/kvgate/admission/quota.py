"""Guaranteed / elastic / cap math: the one place the quota policy is written.

The store (memory or Redis Lua) only checks a reservation against the limits computed here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from kvgate.admission.config import TenantConfig
from kvgate.store import ReserveLimits

if TYPE_CHECKING:
    from kvgate.admission.queue import AdmissionQueue

NO_CAP = 2**50  # exact in Lua's doubles


@dataclass(slots=True)
class TenantQuota:
    """A tenant's live quota (config, overridden by /kvgate/tenant/<name>/quota)."""

    name: str
    guaranteed: int
    weight: float
    hard_cap: int | None
    fraction: float | None = None  # guarantee = fraction x the live total, when set

    @classmethod
    def from_config(cls, t: TenantConfig, total: int) -> TenantQuota:
        if t.guaranteed_fraction is not None:
            guaranteed = int(t.guaranteed_fraction * total)
            return cls(t.name, guaranteed, t.weight, t.hard_cap, t.guaranteed_fraction)
        return cls(t.name, t.guaranteed, t.weight, t.hard_cap)


def elastic_pool(total: int, quotas: Iterable[TenantQuota]) -> int:
    """Capacity beyond all guarantees, shared by weight."""
    return max(0, total - sum(q.guaranteed for q in quotas))


def reserve_limits(
    tenant: TenantQuota,
    *,
    total: int,
    quotas: Mapping[str, TenantQuota],
    usage: Mapping[str, int],
    waiting: Iterable[str],
    request_tokens: int = 0,
) -> ReserveLimits:
    """Limits for one reservation by ``tenant``.

    ``waiting`` names tenants with queued work. While another tenant waits, a tenant's
    elastic use is limited to its weighted share of the pool (among tenants using or
    wanting elastic capacity); otherwise it may borrow the whole pool (work-conserving).
    A tenant with no elastic use may always take one request beyond its share.
    """
    pool = elastic_pool(total, quotas.values())
    others_waiting = {w for w in waiting if w != tenant.name}
    share = pool
    if others_waiting:
        contenders = others_waiting | {tenant.name}
        contenders |= {
            name
            for name, used in usage.items()
            if used > (quotas[name].guaranteed if name in quotas else 0)
        }
        weights = sum(quotas[c].weight if c in quotas else 1.0 for c in contenders)
        share = int(pool * tenant.weight / weights) if weights > 0 else pool
        if usage.get(tenant.name, 0) <= tenant.guaranteed:
            # a tenant with no elastic use may always run one request, however small
            # its share, or a low-weight tenant's large requests could never start
            share = max(share, request_tokens)
    cap = tenant.hard_cap if tenant.hard_cap is not None else NO_CAP
    return ReserveLimits(
        total=total,
        tenant_cap=cap,
        guaranteed=tenant.guaranteed,
        elastic_pool=pool,
        tenant_elastic_limit=share,
    )


def max_admissible(tenant: TenantQuota, total: int) -> int:
    """The largest single request this tenant could ever be admitted with."""
    cap = tenant.hard_cap if tenant.hard_cap is not None else total
    return min(cap, total)


def limits_at(
    tenant: TenantQuota,
    quotas: Mapping[str, TenantQuota],
    usage: Mapping[str, int],
    queue: AdmissionQueue,
    long_reserved_fraction: float,
    request_tokens: int,
    *,
    fair_share: bool = True,
) -> Callable[[int], ReserveLimits]:
    """The limits of one reservation as a function of the cluster total it is checked
    against (the shared total, or the local share while the store is down).

    Without ``fair_share`` (degraded work) the weighted share among waiting tenants does
    not apply; caps, guarantees and the elastic pool do. Short requests leave room for
    long queued ones (``AdmissionQueue.held_back_for_long``).
    """

    def at(total: int) -> ReserveLimits:
        limits = reserve_limits(
            tenant,
            total=total,
            quotas=quotas,
            usage=usage,
            waiting=queue.waiting_tenants() if fair_share else (),
            request_tokens=request_tokens,
        )
        held_back = queue.held_back_for_long(request_tokens, total, long_reserved_fraction)
        if held_back:
            limits = replace(limits, elastic_pool=max(0, limits.elastic_pool - held_back))
        return limits

    return at
