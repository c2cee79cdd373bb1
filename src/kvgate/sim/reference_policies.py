"""Reference policies for the simulator: ``smg-approx`` and ``oracle``.

``smg-approx`` is an independent implementation of the SGLang model gateway's published
cache-aware algorithm (lightseekorg/smg docs/concepts/routing/cache-aware.md): an
approximate per-worker prefix tree of what the gateway sent where (here: the chained
block hashes, so the tree is a set of hash chains per worker with LRU timestamps), a
two-state decision — imbalanced when ``max-min > balance_abs_threshold`` AND
``max > balance_rel_threshold * min`` (defaults 64 and 1.5) → least-loaded worker;
otherwise the worker with the longest match if the match ratio > ``cache_threshold``
(default 0.3), else the least-loaded worker — and periodic LRU eviction
(``eviction_interval`` 120 s, ``max_tree_size`` 2**26 entries). Load is the gateway's
own in-flight request count per worker, as in SMG.

``oracle`` reads each engine's true cache (``EngineCore.cached_prefix_tokens``) and true
queue; it is an upper bound on what routing on prefix reuse can achieve.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

from kvgate.engine.core import EngineCore
from kvgate.routing.policies.base import RoutingContext, expected_tokens
from kvgate.tokens import BLOCK_SIZE
from kvgate.types import RouteDecision, RouteRequest


class SmgApproxPolicy:
    name = "smg-approx"

    def __init__(
        self,
        *,
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
        eviction_interval_s: float = 120.0,
        max_tree_size: int = 2**26,
    ) -> None:
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.eviction_interval_s = eviction_interval_s
        self.max_tree_size = max_tree_size
        # (worker, block hash) -> last use; ordered by last use for LRU eviction
        self._tree: OrderedDict[tuple[str, int], float] = OrderedDict()
        self._last_eviction = 0.0

    def _match(self, node_id: str, hashes: list[int]) -> int:
        n = 0
        for h in hashes:
            if (node_id, h) not in self._tree:
                break
            n += 1
        return n

    def _insert(self, node_id: str, hashes: list[int], now: float) -> None:
        for h in hashes:
            key = (node_id, h)
            self._tree[key] = now
            self._tree.move_to_end(key)

    def _evict(self, now: float) -> None:
        if now - self._last_eviction < self.eviction_interval_s:
            return
        self._last_eviction = now
        while len(self._tree) > self.max_tree_size:
            self._tree.popitem(last=False)

    def choose(self, req: RouteRequest, ctx: RoutingContext) -> RouteDecision:
        self._evict(ctx.now)
        loads = {e.spec.node_id: e.inflight_requests for e in ctx.eligible}
        least = min(sorted(loads), key=lambda n: loads[n])
        hi, lo = max(loads.values()), min(loads.values())
        imbalanced = hi - lo > self.balance_abs_threshold and hi > self.balance_rel_threshold * lo
        node_id, reason = least, "imbalanced_least_load"
        if not imbalanced:
            matches = {n: self._match(n, req.block_hashes) for n in sorted(loads)}
            best = max(matches, key=lambda n: matches[n])
            ratio = matches[best] * BLOCK_SIZE / max(1, req.prompt_tokens)
            if ratio > self.cache_threshold:
                node_id, reason = best, "prefix_match"
            else:
                reason = "miss_least_load"
        self._insert(node_id, req.block_hashes, ctx.now)
        return RouteDecision(
            node_id=node_id,
            reason=reason,
            expected_cached_tokens=expected_tokens(
                self._match(node_id, req.block_hashes), req.prompt_tokens
            )
            if reason == "prefix_match"
            else 0,
            policy=self.name,
        )


def _queue(engine: EngineCore) -> int:
    st = engine.stats()
    return st.running + st.waiting


class OraclePolicy:
    """Most truly cached tokens, unless that node's true queue is much longer."""

    name = "oracle"

    def __init__(self, engines: Mapping[str, EngineCore], *, queue_slack: int = 4) -> None:
        self.engines = engines
        self.queue_slack = queue_slack

    def true_expected(self, node_id: str, req: RouteRequest) -> int:
        cached = self.engines[node_id].cached_prefix_tokens(req.block_hashes)
        return expected_tokens(cached // BLOCK_SIZE, req.prompt_tokens)

    def choose(self, req: RouteRequest, ctx: RoutingContext) -> RouteDecision:
        ids = sorted(e.spec.node_id for e in ctx.eligible)
        queue = {n: _queue(self.engines[n]) for n in ids}
        shortest = min(queue.values())
        candidates = [n for n in ids if queue[n] <= shortest + self.queue_slack]
        cached = {n: self.true_expected(n, req) for n in candidates}
        best = max(candidates, key=lambda n: (cached[n], -queue[n]))
        return RouteDecision(
            node_id=best,
            reason="oracle_cached" if cached[best] else "oracle_queue",
            expected_cached_tokens=cached[best],
            policy=self.name,
        )
