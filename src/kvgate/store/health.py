"""Store up/down with hysteresis, and the metrics of it and of lease fencing.

One outage is one ``down`` and one ``up`` transition, however many pooled connections
break on the way: the first failure marks the backend down; while down, calls fail at
once (``StoreUnavailable``) without touching the server, and a cheap probe (at most one
per ``probe_interval_s``) checks it; only after probes have succeeded for
``recover_after_s`` without a failure in between is it up again. Callers therefore never
see it come back for a moment and fail again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvgate.store.errors import StoreUnavailable

log = logging.getLogger("kvgate.store")

RECOVER_AFTER_S = 2.0
PROBE_INTERVAL_S = 0.5


@dataclass
class StoreHealth:
    """Hysteresis state of one backend (``name`` e.g. "redis", "etcd")."""

    name: str
    url: str
    recover_after_s: float = RECOVER_AFTER_S
    probe_interval_s: float = PROBE_INTERVAL_S
    clock: Callable[[], float] = time.monotonic
    up: bool = True
    transitions: dict[str, int] = field(default_factory=lambda: {"down": 0, "up": 0})
    # lease fencing (backends that hold reservations under a lease)
    lease_reacquired: dict[str, int] = field(default_factory=dict)  # reason → count
    fenced_ops: int = 0
    _ok_since: float | None = None
    _next_probe: float = 0.0
    _last_error: str = ""

    def failed(self, error: BaseException) -> None:
        now = self.clock()
        self._ok_since = None
        self._last_error = f"{type(error).__name__}: {error}"
        if self.up:
            self.up = False
            self.transitions["down"] += 1
            self._next_probe = now + self.probe_interval_s
            log.warning(
                "store %s down (%s); probing every %.1fs",
                self.url,
                self._last_error,
                self.probe_interval_s,
            )

    def _probe_ok(self) -> None:
        now = self.clock()
        if self._ok_since is None:
            self._ok_since = now
        if now - self._ok_since >= self.recover_after_s:
            self.up = True
            self._ok_since = None
            self.transitions["up"] += 1
            log.warning("store %s up again (answered for %.1fs)", self.url, self.recover_after_s)

    async def check(self, probe: Callable[[], Awaitable[object]]) -> None:
        """Return if calls may go to the server now; else raise StoreUnavailable at once."""
        if self.up:
            return
        now = self.clock()
        if now >= self._next_probe:
            self._next_probe = now + self.probe_interval_s
            try:
                await probe()
            except Exception as exc:
                self.failed(exc)
            else:
                self._probe_ok()
            if self.up:
                return
        state = "recovering" if self._ok_since is not None else "down"
        raise StoreUnavailable(f"{self.name} at {self.url} is {state} ({self._last_error})")

    def reacquired(self, reason: str) -> None:
        self.lease_reacquired[reason] = self.lease_reacquired.get(reason, 0) + 1


class StoreHealthCollector(Collector):
    """Exports the health of every backend a store is made of."""

    def __init__(self, healths: Callable[[], Iterable[StoreHealth]]) -> None:
        self._healths = healths

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "kvgate_store_backend_up",
            "1 if the store backend is up (with hysteresis)",
            labels=["backend"],
        )
        flips = CounterMetricFamily(
            "kvgate_store_transitions",
            "Store backend up/down transitions (with hysteresis: one outage = one each)",
            labels=["backend", "to"],
        )
        leases = CounterMetricFamily(
            "kvgate_store_lease_reacquired",
            "Times this gateway re-registered its running reservations under a new lease "
            "(lease_lost: it had expired or been reaped; reconcile: after a store outage)",
            labels=["backend", "reason"],
        )
        fenced = CounterMetricFamily(
            "kvgate_store_fenced_ops",
            "Store writes refused because they carried an expired lease (then re-acquired)",
            labels=["backend"],
        )
        for h in self._healths():
            up.add_metric([h.name], 1.0 if h.up else 0.0)
            for to, n in h.transitions.items():
                flips.add_metric([h.name, to], n)
            for reason in ("lease_lost", "reconcile"):
                leases.add_metric([h.name, reason], h.lease_reacquired.get(reason, 0))
            fenced.add_metric([h.name], h.fenced_ops)
        yield from (up, flips, leases, fenced)
