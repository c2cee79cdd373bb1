"""Deterministic virtual-time cluster simulator driving the production objects."""

from kvgate.sim.cluster import ClusterSim, SimConfig, SimResult, run_comparison
from kvgate.sim.events import ClusterEvent, parse_event

__all__ = ["ClusterEvent", "ClusterSim", "SimConfig", "SimResult", "parse_event", "run_comparison"]
