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

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kvgate.routing.policies.base import RoutingContext
from kvgate.routing.score_table import LoadScores
from kvgate.types import RouteRequest


@dataclass(slots=True)
class Scores:
    """One scorer's scores over the eligible nodes (``ctx.loads``, in that order).

    Most signals are the same on most nodes (no cached prefix, an empty prefill queue, one
    cold boost for a cluster started together), so a scorer says so instead of listing
    every node: ``each`` (one score per node, in order) when the nodes differ, else
    ``every`` for all nodes but those in ``some``.
    """

    each: list[float] | None = None
    every: float = 0.0
    some: dict[str, float] = field(default_factory=dict)


Scorer = Callable[[RouteRequest, RoutingContext], Scores]


def cache_score(req: RouteRequest, ctx: RoutingContext) -> Scores:
    rate = ctx.prefill.tokens_per_s
    loads = ctx.loads
    return Scores(
        every=0.0,
        some={n: t / rate for n, t in ctx.prefix_matches(req).items() if n in loads},
    )


def queue_score(req: RouteRequest, ctx: RoutingContext) -> Scores:
    if not ctx.flags["load_guard"]:
        return Scores()
    loads = ctx.loads
    backlog = ctx.queue.backlogged(ctx.now)
    return Scores(every=-0.0, some={n: -d for n, d in backlog.items() if n in loads})


def decode_score(req: RouteRequest, ctx: RoutingContext) -> Scores:
    """Minus the TTFT a node's running sequences add: their per-sequence cost on the
    step(s) that prefill this request, and, when every sequence slot is taken, the wait
    for enough of them to finish (each has about half of ``max_tokens`` left, and the
    slots free up ``max_running`` at a time)."""
    per_seq = ctx.config.decode_seq_s
    if per_seq <= 0.0 or not ctx.flags["load_guard"]:
        return Scores()
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
    loads = ctx.loads
    return Scores(some={n: c for n, c in out.items() if n in loads})


def cold_boost_score(req: RouteRequest, ctx: RoutingContext) -> Scores:
    full = ctx.prefill.prefill_s(req.prompt_tokens)
    if not ctx.flags["cold_boost"]:
        return Scores()
    common = ctx.nodes.common_boost()
    if common is not None:
        return Scores(every=common * full)
    boosts = ctx.boosts()
    values = boosts.values()
    if values and min(values) == max(values):
        return Scores(every=next(iter(values)) * full)
    return Scores(each=[boosts[n] * full for n in ctx.loads])


def load_score(req: RouteRequest, ctx: RoutingContext) -> Scores:
    step = ctx.prefill.step_s
    return Scores(each=[-step * load for load in ctx.loads.values()])


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
    """Σ weight × scorer over the named scorers (unknown names were rejected at load).

    Node by node the same additions in the same order as a plain loop, so the same
    floats; adding a zero term is skipped (x + 0.0 is x: no sum here is ever -0.0).
    Until a scorer gives every node its own score, the sum is one value (``base``) on
    every node but the few in ``fixed``; the ``load`` term is added in the same pass
    that builds the answer (it is the one per-node term of the default policy).
    """
    sums = weighted_score_map(req, ctx, weights)
    return sums.as_dict() if isinstance(sums, LoadScores) else sums


def weighted_score_map(
    req: RouteRequest, ctx: RoutingContext, weights: Mapping[str, float]
) -> dict[str, float] | LoadScores:
    """``weighted_scores``, kept as its parts (``LoadScores``: no pass over every node)
    when the ``load`` term is the last one and every term before it scored most nodes
    alike; else the dict."""
    loads = ctx.loads
    base = 0.0
    fixed: dict[str, float] = {}
    sums: dict[str, float] | None = None  # per node, once a scorer scored each node
    terms = [(name, weight) for name, weight in weights.items() if weight != 0.0]
    for i, (name, weight) in enumerate(terms):
        scorer = SCORERS[name]
        if scorer is load_score:
            neg_step = -ctx.prefill.step_s  # load_score's (-step) * load, the same floats
            if sums is None:
                if i == len(terms) - 1:
                    return LoadScores(loads, base, fixed, weight, neg_step)
                sums = {n: base + weight * (neg_step * load) for n, load in loads.items()}
                for n, total in fixed.items():
                    sums[n] = total + weight * (neg_step * loads[n])
            else:
                sums = {n: sums[n] + weight * (neg_step * load) for n, load in loads.items()}
            continue
        scores = scorer(req, ctx)
        if scores.each is not None:
            if sums is None:
                sums = {n: fixed.get(n, base) for n in loads}
            sums = {n: s + weight * x for (n, s), x in zip(sums.items(), scores.each, strict=True)}
            continue
        held = fixed if sums is None else sums
        now_fixed = {n: held.get(n, base) + weight * x for n, x in scores.some.items()}
        if scores.every != 0.0 or not math.isfinite(weight):
            term = weight * scores.every
            if sums is None:
                base = base + term
                for n, total in fixed.items():
                    fixed[n] = total + term
            else:
                sums = {n: s + term for n, s in sums.items()}
        (fixed if sums is None else sums).update(now_fixed)
    if sums is None:
        sums = dict.fromkeys(loads, base)
        sums.update(fixed)
    return sums
