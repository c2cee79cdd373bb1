"""Virtual-time cluster simulator driving the production engine model and router."""

from kvgate.sim.cluster import SimResult, simulate

__all__ = ["SimResult", "simulate"]
