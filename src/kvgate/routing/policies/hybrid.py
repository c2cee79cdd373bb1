"""Cache-aware policies: ``cache_aware`` (prefix index only) and ``hybrid`` (the default).

hybrid: candidates = prefix-index matches ∪ the route key's home set. Each candidate must
pass the per-request load guard (so affinity never sends work to an overloaded node; one
hot node does not switch affinity off for anyone else). Survivors are scored

    prefix_weight × cached_fraction − load_weight × load / (1 + mean load)
    + cold_boost_weight × boost

and the best wins (ties: lower load, then random). If no candidate survives, or there are
none, the request goes to the least-loaded eligible node — never "the emptiest cache".
"""

from __future__ import annotations

from kvgate.routing.policies.base import RoutingContext
from kvgate.types import RouteDecision, RouteRequest


def _guarded(ctx: RoutingContext, candidates: list[str]) -> list[str]:
    if not ctx.flags["load_guard"] or not candidates:
        return candidates
    least = min(ctx.loads.values())
    return [n for n in candidates if not ctx.overloaded(n, least)]


class CacheAwarePolicy:
    """Most cached prefix among guarded matches; a miss falls back to least load."""

    name = "cache_aware"

    def choose(self, req: RouteRequest, ctx: RoutingContext) -> RouteDecision:
        matches = ctx.prefix_matches(req)
        allowed = _guarded(ctx, list(matches))
        if allowed:
            node_id = ctx.pick({n: float(matches[n]) for n in allowed})
            return RouteDecision(node_id, "prefix_match", matches[node_id], self.name)
        reason = "load_guard_spill" if matches else "least_load_miss"
        node_id = ctx.least_loaded()
        return RouteDecision(node_id, reason, ctx.expected_cached(req, node_id), self.name)


class HybridPolicy:
    name = "hybrid"

    def choose(self, req: RouteRequest, ctx: RoutingContext) -> RouteDecision:
        matches = ctx.prefix_matches(req)
        home = ctx.home_set(req)
        candidates = list(dict.fromkeys([*matches, *home]))
        allowed = _guarded(ctx, candidates)
        if not allowed:
            node_id = ctx.least_loaded()
            reason = "load_guard_spill" if candidates else "least_load_miss"
            expected = matches.get(node_id, 0)
            return RouteDecision(node_id, reason, expected, self.name, tuple(candidates))
        cfg = ctx.config
        mean_load = sum(ctx.loads.values()) / len(ctx.loads)
        load_scale = cfg.load_weight / (1.0 + mean_load)
        prompt = max(1, req.prompt_tokens)
        boosts, loads = ctx.boosts(), ctx.loads
        prefix_scale, boost_weight = cfg.prefix_weight / prompt, cfg.cold_boost_weight
        scores = {
            n: prefix_scale * matches.get(n, 0) - load_scale * loads[n] + boost_weight * boosts[n]
            for n in allowed
        }
        node_id = ctx.pick(scores)
        expected = matches.get(node_id, 0)
        reason = "prefix_match" if expected > 0 else "home_set"
        return RouteDecision(node_id, reason, expected, self.name, tuple(candidates))
