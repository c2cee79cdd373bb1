"""Engine-reported figures from the node view, for admission (watermark, capacity,
headroom).

Both drivers pass these to admission, so the watermark is ``max(ledger, engine KV)`` in
the simulator exactly as in the gateway.
"""

from __future__ import annotations

from collections.abc import Callable

from kvgate.admission.config import HeadroomConfig
from kvgate.routing.node_view import NodeView
from kvgate.types import NodeState

_ROUTABLE = (NodeState.HEALTHY, NodeState.BACKOFF, NodeState.REREGISTER)


def _fresh_kv(nodes: NodeView) -> list[tuple[float, int]]:
    """(KV usage fraction, KV capacity tokens) of each node with a fresh report."""
    out = []
    for entry in nodes.list():
        report = entry.report
        capacity = entry.kv_capacity_tokens
        if report is None or report.stale or not capacity:
            continue
        out.append((report.kv_usage, capacity))
    return out


def engine_kv_tokens(nodes: NodeView) -> int | None:
    """Engine-reported KV tokens in use, for the admission ledger to reconcile with."""
    kv = _fresh_kv(nodes)
    return int(sum(usage * cap for usage, cap in kv)) if kv else None


def engine_kv_capacity(nodes: NodeView) -> int | None:
    """Measured cluster KV capacity (tokens), for the dynamic quota loop."""
    kv = _fresh_kv(nodes)
    return sum(cap for _, cap in kv) if kv else None


def engines_have_headroom(
    nodes: NodeView, *, max_waiting: float, kv_usage_below: float, max_inflight_growth: int
) -> bool:
    """Every node the router may pick has room: a fresh report with at most
    ``max_waiting`` queued requests and KV use below ``kv_usage_below``, and at most
    ``max_inflight_growth`` requests dispatched to it since that report or this gateway's
    requests in flight on it at most that many above the report's running + waiting
    (finished requests leave it). False when no node is eligible. Stops at the first
    node without room (it runs when a limit would hold a request back)."""
    eligible = False
    for entry in nodes.entries():
        state = entry.state
        if state not in _ROUTABLE:
            continue
        eligible = True
        report = entry.report
        if report is None or report.stale or state is NodeState.BACKOFF:
            return False
        if report.waiting > max_waiting or report.kv_usage >= kv_usage_below:
            return False
        # what changed since the report: dispatches to it, or (when many of those have
        # finished, as at high rates) its requests in flight beyond what it reported
        unreported = len(entry.unreported)
        growth = entry.inflight_requests - (report.running + report.waiting)
        if min(unreported, growth) > max_inflight_growth:
            return False
    return eligible


def headroom_signal(nodes: NodeView, config: HeadroomConfig) -> Callable[[], bool]:
    """``engines_have_headroom`` with the admission config's thresholds."""
    return lambda: engines_have_headroom(
        nodes,
        max_waiting=config.max_waiting,
        kv_usage_below=config.kv_usage_below,
        max_inflight_growth=config.max_inflight_growth,
    )
