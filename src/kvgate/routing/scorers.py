"""Weighted scorers: each turns one signal into seconds of predicted TTFT per node.

Higher is better. A policy adds ``weight × score`` over its scorers, so every term is in
the same unit (seconds), and a spill is taken exactly when the seconds saved by leaving
a node's queue exceed the seconds of prefill its cache would have saved:

- ``cache``: prefill time the node's cached prefix saves (cache signal → tokens → s);
- ``queue``: minus the node's predicted prefill queueing delay (the gateway's ledger of
  dispatched, not-yet-prefilled tokens drained at the node's prefill rate);
- ``decode``: minus what the node's running sequences add to this request's TTFT
  (per-sequence step cost, and the wait for a free sequence slot), from the engine
  profile (``decode_seq_s``, ``max_running``; 0 / unset: not modelled);
- ``cold_boost``: a warming-up node scores as if part of the prompt were cached there;
- ``load``: minus the node's load score (requests, tokens, KV), scaled to one step per
  request — a balance term, weight 0 in ``hybrid``.

Each scorer honours its flag: ``cache_affinity`` (cache), ``load_guard`` (queue, decode),
``cold_boost`` (cold boost); off, it scores every node 0.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from kvgate.routing.policies.base import RoutingContext
from kvgate.types import RouteRequest

Scorer = Callable[[RouteRequest, RoutingContext], dict[str, float]]


def cache_score(req: RouteRequest, ctx: RoutingContext) -> dict[str, float]:
    rate = ctx.prefill.tokens_per_s
    matches = ctx.prefix_matches(req)
    return {n: matches.get(n, 0) / rate for n in ctx.loads}


def queue_score(req: RouteRequest, ctx: RoutingContext) -> dict[str, float]:
    if not ctx.flags["load_guard"]:
        return dict.fromkeys(ctx.loads, 0.0)
    return {n: -d for n, d in ctx.queue_delays().items()}


def decode_score(req: RouteRequest, ctx: RoutingContext) -> dict[str, float]:
    """Minus the TTFT a node's running sequences add: their per-sequence cost on the
    step(s) that prefill this request, and, when every sequence slot is taken, the wait
    for enough of them to finish (each has about half of ``max_tokens`` left, and the
    slots free up ``max_running`` at a time)."""
    per_seq = ctx.config.decode_seq_s
    if per_seq <= 0.0 or not ctx.flags["load_guard"]:
        return dict.fromkeys(ctx.loads, 0.0)
    slots = ctx.config.max_running
    step = ctx.prefill.step_s
    out: dict[str, float] = {}
    for e in ctx.eligible:
        rep = e.report
        reported = rep.running + rep.waiting if rep is not None else 0.0
        seqs = max(reported + len(e.unreported), float(len(e.inflight)))
        active = min(seqs, float(slots)) if slots else seqs
        cost = per_seq * active
        if slots and seqs >= slots:
            cost += (seqs - slots + 1) * (req.max_tokens / 2) * (step + cost) / slots
        out[e.spec.node_id] = -cost
    return out


def cold_boost_score(req: RouteRequest, ctx: RoutingContext) -> dict[str, float]:
    full = ctx.prefill.prefill_s(req.prompt_tokens)
    return {n: b * full for n, b in ctx.boosts().items()}


def load_score(req: RouteRequest, ctx: RoutingContext) -> dict[str, float]:
    step = ctx.prefill.step_s
    return {n: -step * load for n, load in ctx.loads.items()}


SCORERS: dict[str, Scorer] = {
    "cache": cache_score,
    "queue": queue_score,
    "decode": decode_score,
    "cold_boost": cold_boost_score,
    "load": load_score,
}


def weighted_scores(
    req: RouteRequest, ctx: RoutingContext, weights: Mapping[str, float]
) -> dict[str, float]:
    """Σ weight × scorer over the named scorers (unknown names were rejected at load)."""
    total = dict.fromkeys(ctx.loads, 0.0)
    for name, weight in weights.items():
        if weight == 0.0:
            continue
        for n, s in SCORERS[name](req, ctx).items():
            total[n] += weight * s
    return total
