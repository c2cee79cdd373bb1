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

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping

from kvgate.engine.core import EngineCore
from kvgate.engine.request import Sequence
from kvgate.routing.policies import RoutingContext, expected_tokens
from kvgate.routing.policies.hybrid import place_new_prefix
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


NEW_PREFIX_SLACK_S = 0.001


class OraclePolicy:
    """Reads every engine's true cache and queue; picks the least predicted TTFT.

    For each eligible engine it predicts this request's TTFT if it were added now by
    replaying the engine's own scheduler on a copy of its state (``predict_ttft``):
    the step in flight, running decodes and chunked prefills, the waiting queue less
    each request's true cached prefix, sequence slots, each step timed by the profile's
    step-time model. For a single request this equals the engine's actual first-token
    time (tests/sim/test_oracle_prediction.py). The cached prefix is the engine's true
    cached blocks plus what a request queued or prefilling ahead there will compute.

    To the prediction it adds what the request costs others on that node: its own
    prefill work (weight ``work_weight``: every request arriving there during it waits)
    and its decode interference (its KV reads and per-sequence cost slow every step
    there while it decodes; the first-token step of each request arriving meanwhile, at
    the node's recent arrival rate, pays it). A prefix no node holds is placed like
    hybrid places it.

    Why nothing should beat it by more than noise: it sees the truth where a gateway
    policy estimates (an index of what it routed, a ledger, lagged reports), and its
    TTFT prediction is exact for the request in isolation. What it lacks is foresight:
    it is greedy per request, with the two cost-to-others terms as the only look
    ahead. A policy beats it only by trading this request's TTFT for later ones' in a
    way those terms misprice (docs/benchmarks.md "The oracle" lists where).
    """

    name = "oracle"

    def __init__(
        self,
        engines: Mapping[str, EngineCore],
        work_weight: float = 1.0,
        interference_weight: float = 1.0,
    ) -> None:
        self.engines = engines
        self.work_weight = work_weight
        self.interference_weight = interference_weight
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
            pending = self._pending_blocks(node, engine, req.block_hashes) * BLOCK_SIZE
            predicted, cached = self.predict(
                engine, req.prompt_tokens, req.block_hashes, ctx.now, min(pending, usable)
            )
            uncached = req.prompt_tokens - cached
            # + the prefill this request adds to the node: work every later request there
            # waits behind (a myopic TTFT minimum spreads prefixes and loses at saturation)
            ttft[node] = (
                predicted
                + self.work_weight * uncached * engine.profile.seconds_per_compute_token
                # while it decodes there, every step on that node is slower by its KV
                # reads and per-sequence cost: the first-token step of each request that
                # arrives there meanwhile (the node's recent arrival rate) pays it
                + self.interference_weight * self._interference(engine, req, node, ctx)
                # hybrid's balance term, so that the two differ only in what they know
                + ctx.config.load_weight * ctx.prefill.step_s * ctx.loads[node]
            )
            cached_by[node] = cached
        if not ttft:
            node = ctx.least_loaded()
            return RouteDecision(node, "oracle_fallback", 0, self.name)
        if max(cached_by.values()) > 0:
            node = ctx.pick({n: -t for n, t in ttft.items()})
        else:
            # hybrid's rule, with the slack of an exact prediction instead of one step
            scores = {n: -t for n, t in ttft.items()}
            node = place_new_prefix(ctx, scores, ctx.home_set(req), NEW_PREFIX_SLACK_S)
        self._pending.setdefault(node, {})[req.request_id] = req.block_hashes
        return RouteDecision(node, "oracle", cached_by[node], self.name, tuple(ttft))

    @staticmethod
    def _interference(
        engine: EngineCore, req: RouteRequest, node: str, ctx: RoutingContext
    ) -> float:
        prof = engine.profile
        batch = len(engine.scheduler.running)
        kv = sum(s.num_computed for s in engine.scheduler.running)
        before = prof.step_time(batch, batch, kv)
        after = prof.step_time(batch + 1, batch + 1, kv + req.prompt_tokens + req.max_tokens // 2)
        life = req.max_tokens * after
        rate = ctx.queue.traffic(node, ctx.now) / ctx.queue.traffic_window_s
        return (after - before) * rate * life

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

    def predict(
        self, engine: EngineCore, prompt_tokens: int, hashes: list[int], now: float, known: int = 0
    ) -> tuple[float, int]:
        """(predicted TTFT in seconds, cached tokens) of a request added to ``engine`` now.

        Cached: what the engine holds, or what a request queued or prefilling ahead of
        it there will have computed by the time it is admitted (``known``: a floor the
        caller knows of)."""
        usable = max(0, (prompt_tokens - 1) // BLOCK_SIZE) * BLOCK_SIZE
        cached = max(known, engine.cached_prefix_tokens(hashes))
        if cached < usable and hashes:
            sched = engine.scheduler
            first = hashes[0]
            for other in [*sched.running, *sched.waiting]:
                theirs = other.req.block_hashes
                if other.num_output or not theirs or theirs[0] != first:
                    continue
                cached = max(cached, _common_prefix(theirs, hashes) * BLOCK_SIZE)
        cached = min(cached, usable)
        uncached = prompt_tokens - cached
        return predict_ttft(engine, uncached, now, self._waiting_uncached) - now, cached


def predict_ttft(
    engine: EngineCore,
    uncached: int,
    now: float,
    waiting_uncached: Callable[[EngineCore, Sequence], int] | None = None,
    max_steps: int = 100_000,
) -> float:
    """When a request with ``uncached`` prompt tokens to compute, added to ``engine`` at
    ``now``, gets its first token: a replay of the engine's scheduler on a copy of its
    state (token counts only), step by step with the profile's step time.

    - the step in flight ends first (a pure-decode run is cut after the step in progress,
      as the engine cuts it when a request arrives), and its tokens are applied;
    - each step serves running requests in order (one token per decode, the next prompt
      chunk per prefill) within ``max_num_batched_tokens``, then admits waiting requests
      first come, first served while ``max_num_seqs`` and the budget allow — the new
      request last; a waiting request computes its prompt less its cached prefix
      (``waiting_uncached``; default: what the engine holds now);
    - a step costs ``step_time(tokens, seqs, kv_tokens)``; when nothing can be admitted
      and every running request decodes, the run to the next finish is one
      ``decode_run_time`` (the engine fast-forwards the same way).

    KV-block pressure (preemption) is not replayed: the oracle keeps engines far from it.
    Requests arriving later join the queue behind this one, so they cannot delay it
    (they can share its last step, which this does not see).
    """
    prof = engine.profile
    sched = engine.scheduler
    budget0 = prof.max_num_batched_tokens
    # running: [tokens left to compute before the next sample, kv tokens, outputs left,
    #           is_new_request]; a decoding request has 1 left
    running: list[list[int]] = []
    for seq in sched.running:
        if seq.done:
            continue
        left = seq.num_tokens - seq.num_computed
        running.append([left, seq.num_computed, seq.output_limit - seq.num_output, 0])
    t = now
    st = engine._step
    if st is not None:
        # apply the step in flight (its first step only: the run is cut there)
        t = max(now, st.first_end if st.steps > 1 else st.end)
        applied = {id(seq): new for seq, new in st.plan.scheduled}
        nxt: list[list[int]] = []
        for seq, r in zip([q for q in sched.running if not q.done], running, strict=True):
            new = applied.get(id(seq), 0)
            if new:
                r[0] -= new
                r[1] += new
                if r[0] <= 0:  # sampled a token
                    r[2] -= 1
                    r[0] = 1
            if r[2] > 0:
                nxt.append(r)
        running = nxt
    uncached_of = waiting_uncached or _waiting_uncached_now
    waiting: list[list[int]] = []
    for seq in sched.waiting:
        comp = uncached_of(engine, seq)
        total = seq.num_tokens
        waiting.append([comp, total - comp, seq.output_limit - seq.num_output, 0])
    waiting.append([max(1, uncached), 0, 1, 1])  # this request
    max_seqs = prof.max_num_seqs
    for _ in range(max_steps):
        budget = budget0
        tokens = kv = seqs = 0
        done_mine = False
        pure_decode = True
        for r in running:
            if budget <= 0:
                pure_decode = False
                break
            new = min(r[0], budget)
            if r[0] != 1:
                pure_decode = False
            budget -= new
            tokens += new
            kv += r[1] + new
            seqs += 1
        wi = 0
        while wi < len(waiting) and budget > 0 and len(running) < max_seqs:
            w = waiting[wi]
            running.append(w)
            wi += 1
            new = min(w[0], budget)
            budget -= new
            tokens += new
            kv += w[1] + new
            seqs += 1
            pure_decode = False
        del waiting[:wi]
        if pure_decode and running and waiting:
            # slots full, everyone decoding: fast-forward to the first finish
            k = min(r[2] for r in running)
            t += prof.decode_run_time(len(running), kv, k)
            for r in running:
                r[1] += k
                r[2] -= k
            running = [r for r in running if r[2] > 0]
            continue
        if seqs == 0:
            return t  # nothing schedulable (cannot happen with the request queued)
        t += prof.step_time(tokens, seqs, kv)
        # apply the step: the served prefix of ``running`` got its tokens
        served = 0
        budget = budget0
        nxt = []
        for r in running:
            if served < seqs:
                served += 1
                new = min(r[0], budget)
                budget -= new
                r[0] -= new
                r[1] += new
                if r[0] <= 0:
                    if r[3]:
                        done_mine = True
                    r[2] -= 1
                    r[0] = 1
            if r[2] > 0:
                nxt.append(r)
        running = nxt
        if done_mine:
            return t
    return t


def _waiting_uncached_now(engine: EngineCore, seq: Sequence) -> int:
    usable = max(0, (seq.req.prompt_tokens - 1) // BLOCK_SIZE) * BLOCK_SIZE
    cached = min(engine.cached_prefix_tokens(seq.req.block_hashes), usable)
    return max(1, seq.num_tokens - seq.num_computed - cached)


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
