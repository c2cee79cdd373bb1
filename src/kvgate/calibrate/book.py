"""Which capacity profile each node uses, and the cluster total they add up to.

A node references a profile by ``model_version`` + ``deployment`` (node config; the
model version defaults to the node's served model, the deployment to "default").
Profiles come from the config (``capacity_profiles``) and from the store
(``/kvgate/capacity/…``, written by ``kvgate calibrate --store``; the store wins).
The calibrated total is the sum over nodes that can take work (not quiescing, not
unreachable) that have a profile; a node without one is *uncalibrated*: it adds
nothing, it is flagged in ``kvgate status`` and in ``kvgate_node_uncalibrated``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kvgate.calibrate.profile import CapacityProfile, ProfileError, parse_profile_key
from kvgate.types import NodeState

NOT_SERVING = (NodeState.QUIESCING, NodeState.UNREACHABLE)
DEFAULT_DEPLOYMENT = "default"


class CapacityBook:
    def __init__(
        self,
        profiles: Iterable[CapacityProfile] = (),
        refs: dict[str, tuple[str | None, str | None]] | None = None,
    ) -> None:
        self._config: dict[tuple[str, str], CapacityProfile] = {
            (p.model_version, p.deployment): p for p in profiles
        }
        self._stored: dict[tuple[str, str], CapacityProfile] = {}
        self._refs = dict(refs or {})  # node id -> (model_version, deployment) from config

    # -- profiles ----------------------------------------------------------------------
    def set_config(
        self,
        profiles: Iterable[CapacityProfile],
        refs: dict[str, tuple[str | None, str | None]] | None = None,
    ) -> None:
        self._config = {(p.model_version, p.deployment): p for p in profiles}
        if refs is not None:
            self._refs = dict(refs)

    def apply_store_value(self, key: str, value: str | None) -> bool:
        ref = parse_profile_key(key)
        if ref is None:
            return False
        if value is None:
            return self._stored.pop(ref, None) is not None
        try:
            profile = CapacityProfile.from_json(value)
        except (ProfileError, ValueError):
            return False
        self._stored[ref] = profile
        return True

    def profiles(self) -> dict[tuple[str, str], CapacityProfile]:
        return {**self._config, **self._stored}

    # -- nodes -------------------------------------------------------------------------
    def ref_for(self, node_id: str, model: str) -> tuple[str, str]:
        version, deployment = self._refs.get(node_id, (None, None))
        return version or model, deployment or DEFAULT_DEPLOYMENT

    def profile_for(self, node_id: str, model: str) -> CapacityProfile | None:
        return self.profiles().get(self.ref_for(node_id, model))

    def node_rows(self, nodes: Iterable[Any]) -> list[dict[str, Any]]:
        """Per node: its reference, capacity and whether it counts (``nodes``: NodeEntry)."""
        rows = []
        for entry in nodes:
            node_id, model = entry.spec.node_id, entry.spec.model
            version, deployment = self.ref_for(node_id, model)
            profile = self.profile_for(node_id, model)
            rows.append(
                {
                    "node_id": node_id,
                    "model_version": version,
                    "deployment": deployment,
                    "capacity_tokens": profile.capacity_runtime_tokens if profile else None,
                    "calibrated": profile is not None,
                    "serving": entry.state not in NOT_SERVING,
                }
            )
        return rows

    def total(self, nodes: Iterable[Any]) -> int | None:
        """Sum of the serving nodes' calibrated capacities; None when no node has one."""
        rows = self.node_rows(nodes)
        if not any(r["calibrated"] for r in rows):
            return None
        return sum(r["capacity_tokens"] for r in rows if r["calibrated"] and r["serving"])

    # -- metrics -----------------------------------------------------------------------
    def register_metrics(
        self, registry: CollectorRegistry, nodes: Callable[[], Iterable[Any]]
    ) -> None:
        registry.register(_BookCollector(self, nodes))


class _BookCollector(Collector):
    def __init__(self, book: CapacityBook, nodes: Callable[[], Iterable[Any]]) -> None:
        self._book = book
        self._nodes = nodes

    def collect(self) -> Iterator[GaugeMetricFamily]:
        rows = self._book.node_rows(self._nodes())
        cap = GaugeMetricFamily(
            "kvgate_node_capacity_tokens",
            "Calibrated capacity (runtime tokens at the latency knee) of each node",
            labels=["node", "model_version", "deployment"],
        )
        uncal = GaugeMetricFamily(
            "kvgate_node_uncalibrated",
            "1 when the node has no capacity profile for its model version + deployment",
            labels=["node"],
        )
        for r in rows:
            if r["calibrated"]:
                cap.add_metric(
                    [r["node_id"], r["model_version"], r["deployment"]], r["capacity_tokens"]
                )
            uncal.add_metric([r["node_id"]], 0.0 if r["calibrated"] else 1.0)
        total = GaugeMetricFamily(
            "kvgate_calibrated_capacity_tokens",
            "Sum of the serving nodes' calibrated capacities (the quota's total)",
        )
        total.add_metric([], float(self._book.total(self._nodes()) or 0))
        yield cap
        yield uncal
        yield total
