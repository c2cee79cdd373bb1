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
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

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
    """Counts of cache choices: plain integers on the decision path, exported as
    Prometheus counters at scrape time and as a JSON-able snapshot."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.decisions = 0
        self.took_best = 0
        self.with_cached_prefix = 0
        self.best_total = 0
        self.forgone_total = 0
        self.forgone_by_reason: Counter[str] = Counter()
        self.left_best_by_reason: Counter[str] = Counter()
        registry.register(_QualityCollector(self))

    def record(self, choice: CacheChoice, reason: str) -> None:
        self.decisions += 1
        best = choice.best
        if best > 0:
            self.with_cached_prefix += 1
            self.best_total += best
        forgone = choice.forgone
        if forgone == 0:
            self.took_best += 1
            return
        self.forgone_total += forgone
        self.forgone_by_reason[reason] += forgone
        self.left_best_by_reason[reason] += 1

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


class _QualityCollector(Collector):
    def __init__(self, quality: DecisionQuality) -> None:
        self._q = quality

    def collect(self) -> Iterator[CounterMetricFamily]:
        q = self._q
        forgone = CounterMetricFamily(
            "kvgate_route_cache_forgone_tokens",
            "Cached prompt tokens a routing decision gave up: the longest expected cached "
            "prefix any eligible node held minus the chosen node's, by route reason",
            labels=["reason"],
        )
        for reason, tokens in sorted(q.forgone_by_reason.items()):
            forgone.add_metric([reason], float(tokens))
        yield forgone
        took = CounterMetricFamily(
            "kvgate_route_cache_best_decisions",
            "Cache-affine routing decisions by whether they took a node holding the longest "
            "expected cached prefix among the eligible nodes",
            labels=["took_best"],
        )
        took.add_metric(["true"], float(q.took_best))
        took.add_metric(["false"], float(q.decisions - q.took_best))
        yield took
        best = CounterMetricFamily(
            "kvgate_route_cache_best_tokens",
            "Longest expected cached prefix any eligible node held, summed over decisions",
        )
        best.add_metric([], float(q.best_total))
        yield best

    def describe(self) -> Iterator[CounterMetricFamily]:
        return iter(())
