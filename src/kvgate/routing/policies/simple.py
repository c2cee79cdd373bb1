"""Baseline policies: random, round_robin, least_request, least_load, consistent_hash."""

from __future__ import annotations

from kvgate.routing.policies.base import RoutingContext
from kvgate.types import RouteDecision, RouteRequest


def _decision(
    policy: str, req: RouteRequest, ctx: RoutingContext, node_id: str, reason: str
) -> RouteDecision:
    return RouteDecision(
        node_id=node_id,
        reason=reason,
        expected_cached_tokens=ctx.expected_cached(req, node_id),
        policy=policy,
    )


class RandomPolicy:
    name = "random"

    def choose(self, req: RouteRequest, ctx: RoutingContext) -> RouteDecision:
        return _decision(self.name, req, ctx, ctx.rng.choice(ctx.node_ids), "random")


class RoundRobinPolicy:
    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, req: RouteRequest, ctx: RoutingContext) -> RouteDecision:
        ids = sorted(ctx.loads)
        node_id = ids[self._next % len(ids)]
        self._next += 1
        return _decision(self.name, req, ctx, node_id, "round_robin")


class LeastRequestPolicy:
    """Fewest of this gateway's in-flight requests (ties at random)."""

    name = "least_request"

    def choose(self, req: RouteRequest, ctx: RoutingContext) -> RouteDecision:
        counts = {e.spec.node_id: -float(e.inflight_requests) for e in ctx.eligible}
        return _decision(self.name, req, ctx, ctx.pick(counts), "least_request")


class LeastLoadPolicy:
    """Lowest load score (reports + ledger), no cold boost."""

    name = "least_load"

    def choose(self, req: RouteRequest, ctx: RoutingContext) -> RouteDecision:
        scores = {n: -load for n, load in ctx.loads.items()}
        return _decision(self.name, req, ctx, ctx.pick(scores), "least_load")


class ConsistentHashPolicy:
    """First node of the route key's bounded-load walk; least load when hashing is off."""

    name = "consistent_hash"

    def choose(self, req: RouteRequest, ctx: RoutingContext) -> RouteDecision:
        home = ctx.home_set(req, 1)
        if home:
            return _decision(self.name, req, ctx, home[0], "home_set")
        return _decision(self.name, req, ctx, ctx.least_loaded(), "least_load_miss")
