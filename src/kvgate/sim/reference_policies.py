"""Reference policies for the simulator: ``oracle`` (a TTFT ceiling) and ``smg-approx``.

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

import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping

from kvgate.engine.core import EngineCore
from kvgate.engine.request import Sequence
from kvgate.routing.policies import RoutingContext, expected_tokens
from kvgate.tokens import BLOCK_SIZE
from kvgate.types import RouteDecision, RouteRequest


def _common_prefix(a: Iterable[int], b: Iterable[int]) -> int:
    """Number of leading block hashes two chains share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class OraclePolicy:
    """Reads every engine's true cache and queue; picks the least predicted TTFT.

    For each eligible engine it predicts when this request's first token would come out
    if it were added now, from the engine's own state and its profile's step-time
    model (the same roofline the engine runs on):

    - the step in flight must finish (a pure-decode run is cut at the step in progress);
    - the scheduler is first come, first served with a per-step token budget: every
      step spends one token per running decode and the rest on prefill, so the prompt
      tokens still to compute ahead of this request (waiting requests less their true
      cached prefix, plus unfinished chunked prefills) and this request's own uncached
      tokens take ``ceil(tokens / (budget − decodes))`` steps;
    - each of those steps costs ``step_time(tokens, seqs, kv_tokens)`` — so decode
      interference (the running batch's KV reads and budget share) is in the estimate;
    - if the engine has no free sequence slot or not enough free KV blocks for what is
      queued, the request also waits for running requests to finish.

    Why nothing can beat it on TTFT by more than noise: per request it minimises the
    predicted TTFT over all nodes with perfect knowledge of cache contents and queues,
    which any gateway policy only estimates (an index of what it routed, a ledger, lagged
    reports). A policy can beat a greedy per-request choice only by giving a request a
    worse TTFT now to make later ones better, and on these workloads that trade is
    small: what a request leaves in a cache is available to later requests wherever the
    oracle put it, since it sees every copy. The estimate is a model of the engine, not a
    replay, so small wins by other policies (a few ms at p90) are within its error.
    """

    name = "oracle"

    def __init__(
        self, engines: Mapping[str, EngineCore], work_weight: float = 3.0, kv_wait: bool = False
    ) -> None:
        self.engines = engines
        self.work_weight = work_weight
        self.kv_wait = kv_wait
        # cached prefix of a waiting request, computed once (it is admitted soon)
        self._waiting_cached: dict[str, int] = {}
        # per node, requests this policy sent there that have not finished prefill: their
        # blocks are about to be cached (truth the engine will have by the time a request
        # queued behind them is scheduled)
        self._pending: dict[str, dict[str, list[int]]] = {}

    def _pending_blocks(self, node: str, engine: EngineCore, hashes: list[int]) -> int:
        pending = self._pending.get(node)
        if not pending or not hashes:
            return 0
        best = 0
        seqs = engine._seqs
        for rid in list(pending):
            seq = seqs.get(rid)
            if seq is None or seq.num_output > 0:
                del pending[rid]
                continue
            theirs = pending[rid]
            if not theirs or theirs[0] != hashes[0]:
                continue
            best = max(best, _common_prefix(theirs, hashes))
        return best

    def choose(self, req: RouteRequest, ctx: RoutingContext) -> RouteDecision:
        ttft: dict[str, float] = {}
        cached_by: dict[str, int] = {}
        usable = max(0, (req.prompt_tokens - 1) // BLOCK_SIZE) * BLOCK_SIZE
        for entry in ctx.eligible:
            node = entry.spec.node_id
            engine = self.engines.get(node)
            if engine is None:
                continue
            cached = engine.cached_prefix_tokens(req.block_hashes)
            pending = self._pending_blocks(node, engine, req.block_hashes) * BLOCK_SIZE
            cached = min(max(cached, pending), usable)
            uncached = req.prompt_tokens - cached
            # + the prefill this request adds to the node: work every later request there
            # waits behind (a myopic TTFT minimum spreads prefixes and loses at saturation)
            ttft[node] = (
                self._predict(engine, uncached, ctx.now)
                + self.work_weight * uncached * engine.profile.seconds_per_compute_token
                # the decode batch this request joins slows every later step there
                # (hybrid's balance term, so the oracle differs from it only in knowledge)
                + ctx.config.load_weight * ctx.prefill.step_s * ctx.loads[node]
            )
            cached_by[node] = cached
        if not ttft:
            node = ctx.least_loaded()
            return RouteDecision(node, "oracle_fallback", 0, self.name)
        if max(cached_by.values()) > 0:
            node = ctx.pick({n: -t for n, t in ttft.items()})
        else:
            node = self._place_new_prefix(ctx, ttft)
        self._pending.setdefault(node, {})[req.request_id] = req.block_hashes
        return RouteDecision(node, "oracle", cached_by[node], self.name, tuple(ttft))

    @staticmethod
    def _place_new_prefix(ctx: RoutingContext, ttft: dict[str, float]) -> str:
        """A prefix no node holds brings its future requests along: among the nodes
        within one engine step of the least predicted TTFT, the one holding the fewest
        live prefixes, then the least recent traffic (what any policy can know)."""
        best = min(ttft.values())
        near = [n for n, t in ttft.items() if t <= best + ctx.prefill.step_s]
        fewest = min(ctx.placements.count(n) for n in near)
        near = [n for n in near if ctx.placements.count(n) == fewest]
        return ctx.pick({n: -ctx.queue.traffic(n, ctx.now) for n in near})

    def _waiting_uncached(self, engine: EngineCore, seq: Sequence) -> int:
        """Prompt tokens a waiting request will compute: its prefix cached by the time
        it is admitted is what is cached now or computed by a request ahead of it."""
        hashes = seq.req.block_hashes
        usable = max(0, (seq.req.prompt_tokens - 1) // BLOCK_SIZE) * BLOCK_SIZE
        cached = engine.cached_prefix_tokens(hashes)
        if cached < usable:
            rid = seq.request_id
            memo = self._waiting_cached.get(rid)
            if memo is None:
                memo = self._waiting_cached[rid] = self._ahead_blocks(engine, seq) * BLOCK_SIZE
                if len(self._waiting_cached) > 100_000:
                    self._waiting_cached.clear()
            cached = max(cached, memo)
        return max(0, seq.num_tokens - seq.num_computed - min(cached, usable))

    @staticmethod
    def _ahead_blocks(engine: EngineCore, seq: Sequence) -> int:
        """Longest shared prefix with a request queued or prefilling ahead of ``seq``."""
        hashes = seq.req.block_hashes
        if not hashes:
            return 0
        sched = engine.scheduler
        best = 0
        for other in [*sched.running, *sched.waiting]:
            if other is seq:
                break
            theirs = other.req.block_hashes
            if not theirs or theirs[0] != hashes[0]:
                continue
            best = max(best, _common_prefix(theirs, hashes))
        return best

    def _predict(self, engine: EngineCore, own: int, now: float) -> float:
        prof = engine.profile
        sched = engine.scheduler
        running = sched.running
        decodes = 0
        prefill_ahead = 0
        kv_tokens = 0
        for s in running:
            left = s.num_tokens - s.num_computed
            kv_tokens += s.num_computed
            if s.num_output:
                decodes += 1
            else:
                prefill_ahead += max(0, left)
        queued_tokens = 0
        for s in sched.waiting:
            queued_tokens += self._waiting_uncached(engine, s)
        prefill_ahead += queued_tokens
        # the step in flight ends first (a decode run is cut after its current step)
        step = engine._step
        wait = 0.0
        if step is not None:
            wait = max(0.0, (step.first_end if step.steps > 1 else step.end) - now)
        budget = max(1, prof.max_num_batched_tokens - decodes)
        tokens = prefill_ahead + max(1, own)
        steps = math.ceil(tokens / budget)
        seqs = decodes + len(sched.waiting) + 1
        if steps == 1:
            total = prof.step_time(tokens + decodes, seqs, kv_tokens + tokens)
        else:
            full = prof.step_time(prof.max_num_batched_tokens, seqs, kv_tokens + budget)
            total = steps * full
        # no room: queued work also waits for running requests to finish
        free_blocks = sched.kv.pool.num_free
        need_blocks = math.ceil(tokens / prof.block_size)
        if self.kv_wait and (
            len(running) + len(sched.waiting) >= prof.max_num_seqs or need_blocks > free_blocks
        ):
            shortest = min(
                (s.output_limit - s.num_output for s in running if s.num_output), default=0
            )
            total += prof.decode_run_time(max(1, decodes), kv_tokens, shortest)
        return wait + total


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
