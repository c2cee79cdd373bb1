"""Routing-decision quality: the cached tokens a decision gave up.

Per cache-affine decision the router knows, from the one cache-signal lookup the
decision made, each eligible node's expected cached prefix (``RoutingContext.
known_matches``: engine truth under policy ``precise`` with every node synced, else the
approximate index). ``best`` is the longest of them, ``chosen`` the chosen node's;
``forgone = best − chosen``. A decision with ``forgone == 0`` took the best available
node (a decision where no node holds anything did too). A decision that gave tokens up
is counted under its route reason (``cost_spill``: the load guard or a cold boost
outscored the cache; ``round_robin``, ``least_load``, …: a policy that does not follow
the cache), or ``cache_affinity_off`` when a cache-aware policy ran with that flag off.
Nodes excluded from the decision (tried, ejected) are not available, so a retry is
measured against the nodes it may still use.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client import Counter as PromCounter

AFFINITY_OFF = "cache_affinity_off"


@dataclass(frozen=True, slots=True)
class CacheChoice:
    """One decision's cached tokens: the best any eligible node held and the chosen node's."""

    best: int
    chosen: int

    @property
    def forgone(self) -> int:
        return max(0, self.best - self.chosen)

    @property
    def took_best(self) -> bool:
        return self.forgone == 0


def cache_choice(known: dict[str, int], node_id: str) -> CacheChoice:
    """``known``: eligible node → expected cached tokens (positive entries only)."""
    best = max(known.values(), default=0)
    return CacheChoice(best, known.get(node_id, 0))


class DecisionQuality:
    """Counts of cache choices, as Prometheus counters and as a JSON-able snapshot."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.forgone_tokens = PromCounter(
            "kvgate_route_cache_forgone_tokens_total",
            "Cached prompt tokens a routing decision gave up: the longest expected cached "
            "prefix any eligible node held minus the chosen node's, by route reason",
            ["reason"],
            registry=registry,
        )
        self.best_decisions = PromCounter(
            "kvgate_route_cache_best_decisions_total",
            "Cache-affine routing decisions by whether they took a node holding the longest "
            "expected cached prefix among the eligible nodes",
            ["took_best"],
            registry=registry,
        )
        self.best_tokens = PromCounter(
            "kvgate_route_cache_best_tokens_total",
            "Longest expected cached prefix any eligible node held, summed over decisions",
            registry=registry,
        )
        self._took = {
            True: self.best_decisions.labels("true"),
            False: self.best_decisions.labels("false"),
        }
        self.decisions = 0
        self.took_best = 0
        self.with_cached_prefix = 0
        self.best_total = 0
        self.forgone_total = 0
        self.forgone_by_reason: Counter[str] = Counter()
        self.left_best_by_reason: Counter[str] = Counter()

    def record(self, choice: CacheChoice, reason: str) -> None:
        took = choice.took_best
        self.decisions += 1
        self._took[took].inc()
        if choice.best > 0:
            self.with_cached_prefix += 1
            self.best_total += choice.best
            self.best_tokens.inc(choice.best)
        if took:
            self.took_best += 1
            return
        forgone = choice.forgone
        self.forgone_total += forgone
        self.forgone_by_reason[reason] += forgone
        self.left_best_by_reason[reason] += 1
        self.forgone_tokens.labels(reason).inc(forgone)

    def snapshot(self) -> dict[str, Any]:
        share = self.took_best / self.decisions if self.decisions else None
        return {
            "decisions": self.decisions,
            "took_best": self.took_best,
            "took_best_share": share,
            "with_cached_prefix": self.with_cached_prefix,
            "best_tokens": self.best_total,
            "forgone_tokens": self.forgone_total,
            "forgone_tokens_by_reason": dict(sorted(self.forgone_by_reason.items())),
            "left_best_by_reason": dict(sorted(self.left_best_by_reason.items())),
        }
