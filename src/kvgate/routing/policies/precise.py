"""Policy ``precise``: hybrid's cost-based placement on the engines' true cache state.

It wraps another policy (``hybrid``, wired in ``policies/__init__.py``): the scoring, spill
rule and placement of new prefixes are that policy's; only the cache signal differs. Per eligible node it is the precise index fed by the
engine's KV events (``kvgate.kv_events``) when that node's event stream is synced, asked
with the engine's own block hashes (at that node's KV block size) when a tokenizer is
configured, and counted in the engine's tokens; else the approximate
prefix index (a node whose publisher just restarted, or that publishes no events, is still
scored). With flag ``precise_events`` off, or no index bound to this router's node view,
every node uses the approximate index — the policy is then exactly hybrid.

Reasons: ``precise_match`` (every eligible node on engine truth), ``cache_match`` (some on
the approximate index), ``cost_spill`` (left the cached node by cost), ``least_cost_miss``
(no node holds the prefix). The metric ``kvgate_kv_events_decisions_total{state}`` counts
the state each decision was made on.
"""

from __future__ import annotations

from kvgate.kv_events.signal import CombinedSignal, signal_for
from kvgate.routing.cache_signal import CacheSignal
from kvgate.routing.policies.base import Policy, RoutingContext
from kvgate.types import RouteDecision, RouteRequest


class PrecisePolicy:
    name = "precise"

    def __init__(self, inner: Policy) -> None:
        self.inner = inner  # the placement policy that scores on the signal

    def _signal(self, req: RouteRequest, ctx: RoutingContext) -> tuple[CacheSignal, str]:
        """The cache signal for this decision and the state it rests on."""
        bound = signal_for(ctx.nodes) if ctx.flags["precise_events"] else None
        if bound is None:
            return ctx.cache, "approximate"
        synced = bound.index.synced_nodes().intersection(ctx.loads)
        if not synced:
            state = "approximate"
        elif len(synced) == len(ctx.loads):
            state = "precise"
        else:
            state = "mixed"
        bound.metrics.decisions.labels(state).inc()
        return CombinedSignal(bound.index, ctx.cache, bound=bound), state

    def choose(self, req: RouteRequest, ctx: RoutingContext) -> RouteDecision:
        ctx.cache, state = self._signal(req, ctx)
        ctx.cache_is_precise = state == "precise"
        decision = self.inner.choose(req, ctx)
        bound = ctx.cache.bound if isinstance(ctx.cache, CombinedSignal) else None
        if bound is not None and req.engine_block_hashes is not None:
            # until the engine's events for this prompt arrive, its blocks count as there
            hashes = req.engine_block_hashes.get(bound.block_size_of(decision.node_id))
            if hashes:
                bound.pending.record(decision.node_id, hashes, ctx.now)
        if decision.reason == "prefix_match":
            reason = "precise_match" if state == "precise" else "cache_match"
        elif decision.reason in ("home_set", "least_load_miss", "evicted_miss"):
            reason = "least_cost_miss"
        else:
            reason = decision.reason
        return RouteDecision(
            decision.node_id, reason, decision.expected_cached_tokens, self.name,
            decision.candidates,
        )  # fmt: skip
