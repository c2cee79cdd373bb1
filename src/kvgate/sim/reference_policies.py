"""Reference policies for the simulator: ``oracle`` (an upper bound) and ``smg-approx``.

Both plug into kvgate's routing policy interface (``kvgate.routing.policies``); the
simulator registers them so the same Router drives them.

``smg-approx`` is an independent implementation of the SGLang model gateway's published
cache-aware algorithm: per-worker approximate prefix trees built from what the gateway
itself routed (not from engine truth), imbalance detection with an absolute and a
relative threshold (defaults 64 and 1.5), a cache-match threshold (default 0.3) and
periodic LRU eviction of the trees (every 120 s) — defaults as documented in SMG's
"Cache-Aware Routing" concept page (lightseekorg/smg, docs/concepts/routing/cache-aware.md).
On a miss it goes to the worker with the smallest tree, the classic sgl-router rule
(newer SMG releases go to the least-loaded worker instead). Ties go to the first worker.
Trees are kept at 16-token block granularity instead of characters.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

from kvgate.engine.core import EngineCore
from kvgate.routing.policies import RoutingContext, expected_tokens
from kvgate.tokens import BLOCK_SIZE
from kvgate.types import RouteDecision, RouteRequest


class OraclePolicy:
    """Sees each engine's true cache and queue; picks the least estimated prefill work."""

    name = "oracle"

    def __init__(self, engines: Mapping[str, EngineCore], decode_weight_tokens: int = 32) -> None:
        self.engines = engines
        self.decode_weight_tokens = decode_weight_tokens

    def choose(self, req: RouteRequest, ctx: RoutingContext) -> RouteDecision:
        costs: dict[str, float] = {}
        cached_by: dict[str, int] = {}
        usable = max(0, (req.prompt_tokens - 1) // BLOCK_SIZE) * BLOCK_SIZE
        for entry in ctx.eligible:
            node = entry.spec.node_id
            engine = self.engines.get(node)
            if engine is None:
                continue
            cached = min(engine.cached_prefix_tokens(req.block_hashes), usable)
            sched = engine.scheduler
            pending = sum(s.num_tokens - s.num_computed for s in sched.waiting)
            pending += sum(max(0, s.req.prompt_tokens - s.num_computed) for s in sched.running)
            costs[node] = (
                (req.prompt_tokens - cached)
                + pending
                + self.decode_weight_tokens * len(sched.running)
            )
            cached_by[node] = cached
        if not costs:
            node = ctx.least_loaded()
            return RouteDecision(node, "oracle_fallback", 0, self.name)
        node = ctx.pick({n: -c for n, c in costs.items()})
        return RouteDecision(node, "oracle", cached_by[node], self.name, tuple(costs))


class SmgApproxPolicy:
    name = "smg-approx"

    def __init__(
        self,
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
        eviction_interval_s: float = 120.0,
        max_tree_blocks: int = 4_194_304,  # 2**26 characters / 16 tokens / ~1 char per token
    ) -> None:
        self.cache_threshold = cache_threshold
        self.balance_abs = balance_abs_threshold
        self.balance_rel = balance_rel_threshold
        self.eviction_interval_s = eviction_interval_s
        self.max_tree_blocks = max_tree_blocks
        self.trees: dict[str, OrderedDict[int, float]] = {}
        self._last_eviction = 0.0

    def _evict(self, now: float) -> None:
        if now - self._last_eviction < self.eviction_interval_s:
            return
        self._last_eviction = now
        for tree in self.trees.values():
            while len(tree) > self.max_tree_blocks:
                tree.popitem(last=False)

    def choose(self, req: RouteRequest, ctx: RoutingContext) -> RouteDecision:
        self._evict(ctx.now)
        workers = [e.spec.node_id for e in ctx.eligible]
        loads = {e.spec.node_id: e.inflight_requests for e in ctx.eligible}
        max_l, min_l = max(loads.values()), min(loads.values())
        matched_blocks = 0
        if max_l - min_l > self.balance_abs and max_l > self.balance_rel * min_l:
            node = min(workers, key=lambda n: loads[n])
            reason = "smg_balance"
            matched_blocks = self._match(node, req)
        else:
            matches = {n: self._match(n, req) for n in workers}
            node = max(workers, key=lambda n: matches[n])  # first worker wins ties
            ratio = matches[node] * BLOCK_SIZE / max(1, req.prompt_tokens)
            if ratio > self.cache_threshold:
                reason, matched_blocks = "smg_cache_hit", matches[node]
            else:
                node = min(workers, key=lambda n: len(self.trees.get(n, ())))
                reason, matched_blocks = "smg_smallest_tree", matches[node]
        tree = self.trees.setdefault(node, OrderedDict())
        for h in req.block_hashes:
            tree[h] = ctx.now
            tree.move_to_end(h)
        expected = expected_tokens(matched_blocks, req.prompt_tokens)
        return RouteDecision(node, reason, expected, self.name, tuple(workers))

    def _match(self, node: str, req: RouteRequest) -> int:
        tree = self.trees.get(node)
        if not tree:
            return 0
        n = 0
        for h in req.block_hashes:
            if h not in tree:
                break
            n += 1
        return n
