"""Filters: which nodes may take a request at all."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from kvgate.types import NodeState, RouteRequest

if TYPE_CHECKING:
    from kvgate.routing.config import RoutingConfig
    from kvgate.routing.node_view import NodeEntry, NodeView

NodeFilter = Callable[["NodeEntry", NodeState, RouteRequest], bool]

_ROUTABLE = frozenset({NodeState.HEALTHY, NodeState.BACKOFF, NodeState.REREGISTER})


def eligible_nodes(
    nodes: NodeView,
    req: RouteRequest,
    config: RoutingConfig,
    now: float,
    exclude: Collection[str] = (),
) -> tuple[list[NodeEntry], dict[str, int]]:
    """Nodes passing the state/freshness, model, pool, backoff-size and exclusion filters.

    Also returns how many nodes each filter removed (for the NoNodeAvailable message).
    """
    out: list[NodeEntry] = []
    dropped = {"excluded": 0, "state": 0, "pool": 0, "model": 0, "backoff_size": 0}
    big = req.total_tokens_estimate > config.backoff_token_threshold
    for entry in nodes.list():
        spec = entry.spec
        if spec.node_id in exclude:
            dropped["excluded"] += 1
            continue
        state = NodeState.UNREACHABLE if not nodes.is_fresh(entry, now) else entry.base_state
        if state not in _ROUTABLE:
            dropped["state"] += 1
            continue
        if req.pool is not None and spec.pool != req.pool:
            dropped["pool"] += 1
            continue
        if spec.model not in ("default", req.model) and req.model not in ("", "default"):
            dropped["model"] += 1
            continue
        if state == NodeState.BACKOFF and big:
            dropped["backoff_size"] += 1
            continue
        out.append(entry)
    return out, dropped
