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
) -> tuple[list[NodeEntry], dict[str, float], dict[str, int]]:
    """Nodes passing the state/freshness, model, pool, backoff-size and exclusion filters.

    Returns the entries, their load scores, and how many nodes each filter removed (for
    the NoNodeAvailable message).
    """
    out: list[NodeEntry] = []
    loads: dict[str, float] = {}
    excluded = state = pool = model = backoff = 0
    big = req.total_tokens_estimate > config.backoff_token_threshold
    oldest = now - config.freshness_s
    want_pool, want_model = req.pool, req.model
    any_model = want_model in ("", "default")
    for entry in nodes.entries():
        spec = entry.spec
        if exclude and spec.node_id in exclude:
            excluded += 1
            continue
        seen = entry.last_report_at if entry.last_report_at is not None else entry.added_at
        current = entry.base_state
        if entry.unreachable_since is not None or seen < oldest or current not in _ROUTABLE:
            state += 1
            continue
        if want_pool is not None and spec.pool != want_pool:
            pool += 1
            continue
        if not any_model and spec.model != "default" and spec.model != want_model:
            model += 1
            continue
        if big and current == NodeState.BACKOFF:
            backoff += 1
            continue
        out.append(entry)
        loads[spec.node_id] = entry.load
    dropped = {
        "excluded": excluded,
        "state": state,
        "pool": pool,
        "model": model,
        "backoff_size": backoff,
    }
    return out, loads, dropped
