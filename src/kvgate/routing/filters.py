"""Filters: which nodes may take a request at all.

Each filter is one small predicate over a node entry; ``RoutingConfig.filters`` names
the ones that run, in order (default: all of them). The caller's exclusions (nodes
already tried by this request) always apply. A node removed by a filter is counted
under that filter's name, so ``NoNodeAvailable`` says why nothing was eligible.

- ``state``: routable state (healthy, backoff, re-register) and a fresh report
  (reports older than ``freshness_s`` make a node unreachable);
- ``pool``: the request's node pool (the degrade path's economy pool), if it names one;
- ``model``: the node serves the requested model (``default`` matches any);
- ``backoff_size``: a node in backoff takes only requests under
  ``backoff_token_threshold`` tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvgate.types import NodeState, RouteRequest

if TYPE_CHECKING:
    from kvgate.routing.config import RoutingConfig
    from kvgate.routing.node_view import NodeEntry, NodeView

_ROUTABLE = frozenset({NodeState.HEALTHY, NodeState.BACKOFF, NodeState.REREGISTER})


@dataclass(frozen=True, slots=True)
class FilterInput:
    """What every filter may read for one request (computed once per decision)."""

    req: RouteRequest
    config: RoutingConfig
    oldest_report: float  # reports before this clock time are stale
    big: bool  # over the backoff size threshold


def state_filter(entry: NodeEntry, f: FilterInput) -> bool:
    seen = entry.last_report_at if entry.last_report_at is not None else entry.added_at
    return (
        entry.unreachable_since is None
        and seen >= f.oldest_report
        and entry.base_state in _ROUTABLE
    )


def pool_filter(entry: NodeEntry, f: FilterInput) -> bool:
    return f.req.pool is None or entry.spec.pool == f.req.pool


def model_filter(entry: NodeEntry, f: FilterInput) -> bool:
    want = f.req.model
    have = entry.spec.model
    return want in ("", "default") or have == "default" or have == want


def backoff_size_filter(entry: NodeEntry, f: FilterInput) -> bool:
    return not (f.big and entry.base_state == NodeState.BACKOFF)


Filter = Callable[["NodeEntry", FilterInput], bool]
FILTERS: dict[str, Filter] = {
    "state": state_filter,
    "pool": pool_filter,
    "model": model_filter,
    "backoff_size": backoff_size_filter,
}
FILTER_NAMES = tuple(FILTERS)


def eligible_nodes(
    nodes: NodeView,
    req: RouteRequest,
    config: RoutingConfig,
    now: float,
    exclude: Collection[str] = (),
) -> tuple[list[NodeEntry], dict[str, float], dict[str, int]]:
    """Nodes passing the exclusions and the configured filters.

    Returns the entries, their load scores, and how many nodes each filter removed (for
    the NoNodeAvailable message).
    """
    f = FilterInput(
        req,
        config,
        now - config.freshness_s,
        req.total_tokens_estimate > config.backoff_token_threshold,
    )
    chain = [(name, FILTERS[name]) for name in config.filters]
    dropped = dict.fromkeys(["excluded", *config.filters], 0)
    out: list[NodeEntry] = []
    loads: dict[str, float] = {}
    for entry in nodes.entries():
        node_id = entry.spec.node_id
        if exclude and node_id in exclude:
            dropped["excluded"] += 1
            continue
        for name, keep in chain:
            if not keep(entry, f):
                dropped[name] += 1
                break
        else:
            out.append(entry)
            loads[node_id] = entry.load
    return out, loads, dropped
