"""Cluster events that can be added to any workload: join, fail, flush."""

from __future__ import annotations

from dataclasses import dataclass

EVENT_KINDS = ("join", "fail", "flush")


@dataclass(frozen=True, slots=True)
class ClusterEvent:
    time: float
    kind: str  # join: a new node starts; fail: a node dies; flush: its prefix cache is reset
    node_id: str


def parse_event(text: str) -> ClusterEvent:
    """``KIND:TIME:NODE``, e.g. ``fail:30:node-2`` or ``join:60:node-8``."""
    parts = text.split(":")
    if len(parts) != 3 or parts[0] not in EVENT_KINDS:
        raise ValueError(f"--event {text!r}: expected KIND:TIME:NODE with KIND in {EVENT_KINDS}")
    try:
        t = float(parts[1])
    except ValueError:
        raise ValueError(f"--event {text!r}: TIME must be a number of seconds") from None
    if t < 0 or not parts[2]:
        raise ValueError(f"--event {text!r}: TIME must be >= 0 and NODE non-empty")
    return ClusterEvent(t, parts[0], parts[2])
