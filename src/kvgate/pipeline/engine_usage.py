"""Engine-reported KV figures from the node view, for admission (watermark, capacity).

Both drivers pass these to admission, so the watermark is ``max(ledger, engine KV)`` in
the simulator exactly as in the gateway.
"""

from __future__ import annotations

from kvgate.routing.node_view import NodeView


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
