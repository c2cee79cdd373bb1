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
  ``backoff_token_threshold`` tokens;
- ``endpoint``: the node's engine type serves the request's endpoint kind
  (``kvgate.routing.endpoints``: embeddings, rerank, tokenize … are not served by all).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from kvgate.routing.config import FILTER_NAMES, RoutingConfig
from kvgate.routing.endpoints import GENERATE, serves
from kvgate.routing.node_view import EligibleSet, NodeEntry, NodeView
from kvgate.types import NodeState, RouteRequest

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


def endpoint_filter(entry: NodeEntry, f: FilterInput) -> bool:
    endpoint = f.req.endpoint
    return endpoint == GENERATE or serves(entry.spec.engine_type, endpoint)


Filter = Callable[[NodeEntry, FilterInput], bool]
# keyed by config.FILTER_NAMES, in that order (the configuration validates names there)
FILTERS: dict[str, Filter] = {
    "state": state_filter,
    "pool": pool_filter,
    "model": model_filter,
    "backoff_size": backoff_size_filter,
    "endpoint": endpoint_filter,
}

_MAX_KINDS = 16  # distinct (pool, model, size, endpoint) request kinds kept


def _evaluate(nodes: NodeView, f: FilterInput, now: float) -> EligibleSet:
    config = f.config
    chain = [(name, FILTERS[name]) for name in config.filters]
    dropped = dict.fromkeys(["excluded", *config.filters], 0)
    dropped_by: dict[str, str] = {}
    out: list[NodeEntry] = []
    loads: dict[str, float] = {}
    oldest_fresh = float("inf")
    for entry in nodes.entries():
        seen = entry.last_report_at if entry.last_report_at is not None else entry.added_at
        if f.oldest_report <= seen < oldest_fresh:
            oldest_fresh = seen
        for name, keep in chain:
            if not keep(entry, f):
                dropped[name] += 1
                dropped_by[entry.spec.node_id] = name
                break
        else:
            out.append(entry)
            loads[entry.spec.node_id] = entry.load
    return EligibleSet(config, now, oldest_fresh, out, loads, dropped, dropped_by)


def eligible_nodes(
    nodes: NodeView,
    req: RouteRequest,
    config: RoutingConfig,
    now: float,
    exclude: Collection[str] = (),
) -> tuple[list[NodeEntry], dict[str, float], dict[str, int]]:
    """Nodes passing the exclusions and the configured filters.

    Returns the entries (in the node view's order), their load scores, and how many
    nodes each filter removed (for the NoNodeAvailable message); an excluded node counts
    under ``excluded`` whatever the filters say of it.
    """
    big = req.total_tokens_estimate > config.backoff_token_threshold
    kind = (req.pool, req.model, big, req.endpoint)
    memo = nodes.eligibility.get(kind)
    if memo is None or not memo.valid(config, now):
        memo = _evaluate(nodes, FilterInput(req, config, now - config.freshness_s, big), now)
        if len(nodes.eligibility) >= _MAX_KINDS:
            nodes.eligibility.clear()
        nodes.eligibility[kind] = memo
    entries, loads, dropped = memo.entries, dict(memo.loads), dict(memo.dropped)
    if exclude:
        excluded = exclude if isinstance(exclude, (set, frozenset)) else set(exclude)
        removed = False
        for node_id in excluded:
            if node_id not in nodes:
                continue
            dropped["excluded"] += 1
            reason = memo.dropped_by.get(node_id)
            if reason is not None:
                dropped[reason] -= 1
            else:
                del loads[node_id]
                removed = True
        if removed:
            return [e for e in entries if e.spec.node_id in loads], loads, dropped
    return list(entries), loads, dropped


__all__ = [
    "FILTERS",
    "FILTER_NAMES",
    "EligibleSet",
    "Filter",
    "FilterInput",
    "backoff_size_filter",
    "eligible_nodes",
    "endpoint_filter",
    "model_filter",
    "pool_filter",
    "state_filter",
]
