"""Prometheus metrics of the routing layer (kvgate_ prefix, injectable registry)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kvgate.metric_children import BoundChildren
from kvgate.types import NodeState


class RoutingMetrics(BoundChildren):
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        super().__init__()
        r = self.registry
        self.decisions = Counter(
            "kvgate_route_decisions_total",
            "Routing decisions by policy and reason",
            ["policy", "reason"],
            registry=r,
        )
        self.no_node = Counter(
            "kvgate_route_no_node_total", "Requests no node could take", ["policy"], registry=r
        )
        self.expected_cached = Counter(
            "kvgate_route_expected_cached_tokens_total",
            "Cached prompt tokens the router predicted, for requests whose engine reported usage",
            ["node"],
            registry=r,
        )
        self.actual_cached = Counter(
            "kvgate_route_actual_cached_tokens_total",
            "Cached prompt tokens the engine reported (usage.prompt_tokens_details)",
            ["node"],
            registry=r,
        )
        self.hit_ratio = Histogram(
            "kvgate_cache_hit_prediction_ratio",
            "actual / expected cached tokens per request with a predicted hit",
            ["node"],
            buckets=(0.0, 0.25, 0.5, 0.75, 0.9, 1.0, 1.5),
            registry=r,
        )
        self.evictions = Counter(
            "kvgate_prefix_index_evictions_total",
            "Prefix index entries evicted by the size bound",
            registry=r,
        )
        self.demotions = Counter(
            "kvgate_node_demotions_total",
            "(node, prefix) pairs demoted by hit feedback",
            ["node"],
            registry=r,
        )
        self.restorations = Counter(
            "kvgate_node_restorations_total",
            "(node, prefix) pairs restored after serving the prefix again",
            ["node"],
            registry=r,
        )
        self.reregistrations = Counter(
            "kvgate_node_reregistrations_total",
            "Node restarts detected (index entries purged, cold boost restarted)",
            ["node"],
            registry=r,
        )

    def add_live_collector(self, collect: Callable[[], Iterator[GaugeMetricFamily]]) -> None:
        self.registry.register(_Live(collect))


class _Live(Collector):
    """Gauges computed at scrape time from the live objects (state, index size, boost)."""

    def __init__(self, collect: Callable[[], Iterator[GaugeMetricFamily]]) -> None:
        self._collect = collect

    def collect(self) -> Iterator[GaugeMetricFamily]:
        return self._collect()

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())


def state_family(states: dict[str, NodeState]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "kvgate_node_state", "1 for the node's current routing state", labels=["node", "state"]
    )
    for node, current in sorted(states.items()):
        for state in NodeState:
            family.add_metric([node, state.value], 1.0 if state == current else 0.0)
    return family
