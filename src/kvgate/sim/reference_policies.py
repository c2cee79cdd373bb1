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
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import NamedTuple

from kvgate.engine.core import EngineCore
from kvgate.engine.request import Sequence
from kvgate.routing.policies import RoutingContext, expected_tokens
from kvgate.routing.policies.hybrid import place_new_prefix
from kvgate.tokens import BLOCK_SIZE
from kvgate.types import RouteDecision, RouteRequest
from kvgate.workloads.base import PromptCache, WorkItem


def _common_prefix(a: Iterable[int], b: Iterable[int]) -> int:
    """Number of leading block hashes two chains share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


NEW_PREFIX_SLACK_S = 0.001
HORIZON_S = 0.25  # look ahead over the arrivals within this window ...
MAX_AHEAD = 4  # ... at most this many
CANDIDATES = 2  # nodes rolled out: greedy's choice and the next best by greedy cost
ROLLOUT_EPS_S = 1e-6


class _Ahead(NamedTuple):
    """A request of the trace arriving within the look-ahead horizon."""

    arrival: float
    prompt_tokens: int
    hashes: list[int]
    max_tokens: int


class OraclePolicy:
    """Reads every engine's true cache and queue and the trace to come; picks the node
    whose placement costs this request and the next arrivals least.

    Greedy cost of a request on a node: its TTFT there, predicted by replaying the
    engine's own scheduler on a copy of its state (``snapshot`` + ``replay``: the step
    in flight, running decodes and chunked prefills, the waiting queue less each
    request's true cached prefix, sequence slots, each step timed by the profile's
    step-time model; for requests added at or after now this equals the engine's
    first-token times, tests/sim/test_oracle_prediction.py), plus what it costs others
    there: its own prefill work (``work_weight``: every request arriving there during it
    waits), its decode interference (its KV reads and per-sequence cost slow every step
    there while it decodes; the first-token step of each request arriving meanwhile, at
    the node's recent arrival rate, pays it) and hybrid's balance term. The cached
    prefix is the engine's true cached blocks or what a request queued or prefilling
    ahead there will compute.

    Look-ahead (the simulator hands it the trace, ``future``): the greedy choice and the
    next best ``candidates - 1`` nodes are each rolled out — this request placed there,
    then each of the next ``max_ahead`` arrivals within ``horizon_s`` placed in arrival
    order where its own greedy cost is least, on the engines' states with the earlier
    ones of the rollout added (their shared prefixes counted as cached) — and the
    candidate with the least summed greedy cost wins. With no arrival ahead it is the
    greedy choice. A prefix no node holds goes, among the nodes within
    ``NEW_PREFIX_SLACK_S`` of the least cost, to the node whose prefixes the trace will
    ask for least over the placement window (true future demand where hybrid counts live
    prefixes), then by hybrid's rule.

    Why nothing should beat it by more than noise: a gateway policy sees an index of
    what it routed, a ledger and lagged reports, and nothing of the future; this sees
    the engines' truth, predicts every TTFT of the rollout exactly (short of the
    preemptions it keeps engines away from), and chooses with the arrivals to come in
    view. Beating it needs a decision whose payoff lies beyond the horizon; where that
    happens is measured (docs/benchmarks.md "The oracle").
    """

    name = "oracle"

    def __init__(
        self,
        engines: Mapping[str, EngineCore],
        work_weight: float = 1.0,
        interference_weight: float = 1.0,
        future: Seq[WorkItem] = (),
        horizon_s: float = HORIZON_S,
        max_ahead: int = MAX_AHEAD,
        candidates: int = CANDIDATES,
        only_when_queued: bool = True,
    ) -> None:
        self.engines = engines
        # the trace to come (the simulator knows it): the rollout's look ahead
        self._items = list(future)
        self._index = {item.request_id: i for i, item in enumerate(self._items)}
        self._tokenizer = PromptCache()
        self._prompts: dict[str, _Ahead] = {}
        self.horizon_s = horizon_s
        # the trace's demand per route key over the placement window, and where each
        # route key's prefix was last placed
        self._window: Counter[str] = Counter()
        self._keys: dict[int, str] = {}
        self._lo = self._hi = 0
        self._owner: dict[str, str] = {}
        self.max_ahead = max_ahead
        self.candidates = candidates
        self.only_when_queued = only_when_queued
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

    def _cached(self, node: str, prompt_tokens: int, hashes: list[int]) -> int:
        """Cached prefix (tokens) a request finds on ``node``: the engine's true cache,
        a request queued or prefilling ahead there, or one this policy sent there."""
        usable = max(0, (prompt_tokens - 1) // BLOCK_SIZE) * BLOCK_SIZE
        engine = self.engines[node]
        pending = self._pending_blocks(node, engine, hashes) * BLOCK_SIZE
        return self._engine_cached(engine, prompt_tokens, hashes, min(pending, usable))

    def _others(
        self,
        node: str,
        prompt_tokens: int,
        max_tokens: int,
        uncached: int,
        ctx: RoutingContext,
    ) -> float:
        """What a request costs the others on ``node`` (seconds), added to its TTFT."""
        engine = self.engines[node]
        # the prefill this request adds to the node: work every later request there
        # waits behind (a myopic TTFT minimum spreads prefixes and loses at saturation)
        return (
            self.work_weight * uncached * engine.profile.seconds_per_compute_token
            # while it decodes there, every step on that node is slower by its KV
            # reads and per-sequence cost: the first-token step of each request that
            # arrives there meanwhile (the node's recent arrival rate) pays it
            + self.interference_weight
            * self._interference(engine, prompt_tokens, max_tokens, node, ctx)
            # hybrid's balance term, so that the two differ only in what they know
            + ctx.config.load_weight * ctx.prefill.step_s * ctx.loads[node]
        )

    def choose(self, req: RouteRequest, ctx: RoutingContext) -> RouteDecision:
        now = ctx.now
        nodes = [e.spec.node_id for e in ctx.eligible if e.spec.node_id in self.engines]
        if not nodes:
            node = ctx.least_loaded()
            return RouteDecision(node, "oracle_fallback", 0, self.name)
        snaps = {n: snapshot(self.engines[n], now, self._waiting_uncached) for n in nodes}
        cost: dict[str, float] = {}
        cached_by: dict[str, int] = {}
        for n in nodes:
            cached = self._cached(n, req.prompt_tokens, req.block_hashes)
            uncached = req.prompt_tokens - cached
            first = replay(self.engines[n], snaps[n], [Extra(now, max(1, uncached), 0, 1)])[0]
            cost[n] = (
                first - now + self._others(n, req.prompt_tokens, req.max_tokens, uncached, ctx)
            )
            cached_by[n] = cached
        if max(cached_by.values()) > 0:
            node = ctx.pick({n: -t for n, t in cost.items()})
        else:
            node = self._place_new(req, ctx, cost)
        reason = "oracle"
        # the look-ahead only where a queue has formed: on engines that admit every
        # request at the next step, a placement delays nobody's admission, and the greedy
        # cost is exact for this request
        queued = not self.only_when_queued or any(snaps[n].waiting for n in nodes)
        ahead = self._ahead(req, now) if queued else []
        if ahead and len(nodes) > 1:
            better = self._rollout(req, ctx, nodes, snaps, cost, cached_by, node, ahead)
            if better != node:
                node, reason = better, "oracle_lookahead"
        self._owner[req.route_key] = node  # where the route key's requests now go
        self._pending.setdefault(node, {})[req.request_id] = req.block_hashes
        return RouteDecision(node, reason, cached_by[node], self.name, tuple(cost))

    def _place_new(self, req: RouteRequest, ctx: RoutingContext, cost: dict[str, float]) -> str:
        """A prefix no node holds: among the nodes within ``NEW_PREFIX_SLACK_S`` of the
        least cost, the one whose prefixes bring the fewest requests in the trace to
        come (over the placement window ``ctx.placements.ttl_s``: the true demand where
        hybrid counts live prefixes), then hybrid's rule."""
        best = min(cost.values())
        near = [n for n, c in cost.items() if c <= best + NEW_PREFIX_SLACK_S]
        if len(near) > 1 and self._items:
            demand = self._demand(req, ctx)
            least = min(demand.get(n, 0) for n in near)
            near = [n for n in near if demand.get(n, 0) == least]
        scores = {n: -cost[n] for n in near}
        return place_new_prefix(ctx, scores, ctx.home_set(req), NEW_PREFIX_SLACK_S)

    def _demand(self, req: RouteRequest, ctx: RoutingContext) -> dict[str, int]:
        """Per node: arrivals after ``req`` within the placement window whose route key
        this policy last placed there."""
        idx = self._index.get(req.request_id)
        if idx is None:
            return {}
        window = self._window
        items = self._items
        end = ctx.now + ctx.placements.ttl_s
        while self._hi < len(items) and items[self._hi].arrival <= end:
            window[self._key_of(self._hi, req, ctx)] += 1
            self._hi += 1
        while self._lo <= idx and self._lo < self._hi:
            key = self._key_of(self._lo, req, ctx)
            window[key] -= 1
            if window[key] <= 0:
                del window[key]
            self._lo += 1
        demand: Counter[str] = Counter()
        owner = self._owner
        for key, count in window.items():
            node = owner.get(key)
            if node is not None:
                demand[node] += count
        return demand

    def _key_of(self, i: int, req: RouteRequest, ctx: RoutingContext) -> str:
        key = self._keys.get(i)
        if key is None:
            key = self._keys[i] = self._items[i].route_key(req.model, ctx.config.route_key)
        else:
            del self._keys[i]  # needed twice: entering and leaving the window
        return key

    def _ahead(self, req: RouteRequest, now: float) -> list[_Ahead]:
        """The requests arriving after ``req`` within the horizon (at most ``max_ahead``)."""
        if self.max_ahead <= 0 or not self._items:
            return []
        idx = self._index.get(req.request_id)
        if idx is None:
            return []
        out: list[_Ahead] = []
        end = now + self.horizon_s
        for item in self._items[idx + 1 : idx + 1 + self.max_ahead]:
            if item.arrival > end:
                break
            got = self._prompts.get(item.request_id)
            if got is None:
                prompt = self._tokenizer.prompt(item)
                got = _Ahead(
                    item.arrival, prompt.prompt_tokens, prompt.block_hashes, item.max_tokens
                )
                self._prompts[item.request_id] = got
                if len(self._prompts) > 4 * self.max_ahead + 64:
                    self._prompts.pop(next(iter(self._prompts)))
            out.append(got)
        return out

    def _rollout(
        self,
        req: RouteRequest,
        ctx: RoutingContext,
        nodes: list[str],
        snaps: dict[str, Snapshot],
        cost: dict[str, float],
        cached_by: dict[str, int],
        greedy: str,
        ahead: list[_Ahead],
    ) -> str:
        """The candidate (greedy's choice and the next best by greedy cost) whose rollout
        costs least: this request placed there, then each request of ``ahead`` placed in
        arrival order where its own greedy cost (same formula, on the engines' states
        with the earlier ones of the rollout added) is least; the rollout's cost is the
        sum of those greedy costs. With no request ahead it is the greedy choice."""
        ranked = sorted(nodes, key=lambda n: cost[n])
        others = [n for n in ranked if n != greedy]
        cands = [greedy, *others[: self.candidates - 1]]
        base: dict[tuple[int, str], tuple[float, int]] = {}

        def alone(i: int, n: str) -> tuple[float, int]:
            got = base.get((i, n))
            if got is None:
                f = ahead[i]
                cached = self._cached(n, f.prompt_tokens, f.hashes)
                x = Extra(f.arrival, f.prompt_tokens - cached, cached, f.max_tokens)
                first = replay(self.engines[n], snaps[n], [x])[0]
                got = base[(i, n)] = (
                    first
                    - f.arrival
                    + self._others(n, f.prompt_tokens, f.max_tokens, x.uncached, ctx),
                    cached,
                )
            return got

        best_node, best_total = greedy, math.inf
        for c in cands:
            r_cached = cached_by[c]
            r_extra = Extra(ctx.now, req.prompt_tokens - r_cached, r_cached, req.max_tokens)
            placed: dict[str, list[tuple[Extra, list[int]]]] = {c: [(r_extra, req.block_hashes)]}
            total = cost[c]
            for i, f in enumerate(ahead):
                usable = max(0, (f.prompt_tokens - 1) // BLOCK_SIZE) * BLOCK_SIZE
                pick, pick_cost, pick_extra = c, math.inf, r_extra
                for n in nodes:
                    mine = placed.get(n)
                    if mine is None:
                        f_cost, cached = alone(i, n)
                        x = Extra(f.arrival, f.prompt_tokens - cached, cached, f.max_tokens)
                    else:
                        cached = alone(i, n)[1]
                        for _, h in mine:
                            if h and f.hashes and h[0] == f.hashes[0]:
                                cached = max(cached, _common_prefix(h, f.hashes) * BLOCK_SIZE)
                        cached = min(cached, usable)
                        x = Extra(f.arrival, f.prompt_tokens - cached, cached, f.max_tokens)
                        first = replay(self.engines[n], snaps[n], [e for e, _ in mine] + [x])[-1]
                        f_cost = (
                            first
                            - f.arrival
                            + self._others(n, f.prompt_tokens, f.max_tokens, x.uncached, ctx)
                        )
                    if f_cost < pick_cost:
                        pick, pick_cost, pick_extra = n, f_cost, x
                total += pick_cost
                placed.setdefault(pick, []).append((pick_extra, f.hashes))
            if total < best_total - ROLLOUT_EPS_S:
                best_node, best_total = c, total
        return best_node

    @staticmethod
    def _interference(
        engine: EngineCore, prompt_tokens: int, max_tokens: int, node: str, ctx: RoutingContext
    ) -> float:
        prof = engine.profile
        batch = len(engine.scheduler.running)
        kv = sum(s.num_computed for s in engine.scheduler.running)
        before = prof.step_time(batch, batch, kv)
        after = prof.step_time(batch + 1, batch + 1, kv + prompt_tokens + max_tokens // 2)
        life = max_tokens * after
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
        cached = self._engine_cached(engine, prompt_tokens, hashes, known)
        uncached = prompt_tokens - cached
        return predict_ttft(engine, uncached, now, self._waiting_uncached) - now, cached

    @staticmethod
    def _engine_cached(
        engine: EngineCore, prompt_tokens: int, hashes: list[int], known: int
    ) -> int:
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
        return min(cached, usable)


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
    snap = snapshot(engine, now, waiting_uncached)
    return replay(engine, snap, [Extra(now, max(1, uncached), 0, 1)], max_steps)[0]


class Snapshot(NamedTuple):
    """An engine's state as token counts, once the step in flight has ended (``t``).

    ``running``/``waiting`` rows: [tokens left to compute before the next sample, kv
    tokens, outputs left, extra index + 1 (0: the engine's own)]; a decoding row has 1
    left."""

    t: float
    running: list[list[int]]
    waiting: list[list[int]]


class Extra(NamedTuple):
    """A request added to a replay: arrives at ``arrival`` with ``uncached`` prompt tokens
    to compute, ``cached`` already held, and ``outputs`` tokens to generate."""

    arrival: float
    uncached: int
    cached: int
    outputs: int


def snapshot(
    engine: EngineCore,
    now: float,
    waiting_uncached: Callable[[EngineCore, Sequence], int] | None = None,
) -> Snapshot:
    """``engine``'s state at ``now`` for ``replay``: the step in flight applied (its
    first step only: a pure-decode run is cut there when a request arrives)."""
    sched = engine.scheduler
    running: list[list[int]] = []
    for seq in sched.running:
        if seq.done:
            continue
        left = seq.num_tokens - seq.num_computed
        running.append([left, seq.num_computed, seq.output_limit - seq.num_output, 0])
    t = now
    st = engine._step
    if st is not None:
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
        waiting.append([comp, seq.num_tokens - comp, seq.output_limit - seq.num_output, 0])
    return Snapshot(t, running, waiting)


def replay(
    engine: EngineCore, snap: Snapshot, extras: list[Extra], max_steps: int = 100_000
) -> list[float]:
    """First-token time of each of ``extras`` (in arrival order) added to the engine in
    state ``snap``: the scheduler replayed step by step (see ``predict_ttft``). An extra
    joins the queue at the first step boundary at or after its arrival (the engine ends
    the step in progress, then schedules it); an idle engine waits for the next one."""
    prof = engine.profile
    budget0 = prof.max_num_batched_tokens
    max_seqs = prof.max_num_seqs
    running = [r[:] for r in snap.running]
    waiting = [r[:] for r in snap.waiting]
    t = snap.t
    out = [0.0] * len(extras)
    left = len(extras)
    ei = 0
    for _ in range(max_steps):
        while ei < len(extras) and extras[ei].arrival <= t:
            x = extras[ei]
            ei += 1
            waiting.append([max(1, x.uncached), x.cached, max(1, x.outputs), ei])
        budget = budget0
        tokens = kv = seqs = 0
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
            if ei < len(extras):  # idle until the next arrival
                t = max(t, extras[ei].arrival)
                continue
            return out  # nothing schedulable (cannot happen with an extra queued)
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
                    if r[3]:  # an extra's first token
                        out[r[3] - 1] = t
                        r[3] = 0
                        left -= 1
                    r[2] -= 1
                    r[0] = 1
            if r[2] > 0:
                nxt.append(r)
        running = nxt
        if left == 0:
            return out
    return out


def _waiting_uncached_now(engine: EngineCore, seq: Sequence) -> int:
    usable = max(0, (seq.req.prompt_tokens - 1) // BLOCK_SIZE) * BLOCK_SIZE
    cached = min(engine.cached_prefix_tokens(seq.req.block_hashes), usable)
    return max(1, seq.num_tokens - seq.num_computed - cached)


@dataclass(eq=False)
class SmgApproxPolicy:
    name = "smg-approx"
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    eviction_interval_s: float = 120.0
    max_tree_blocks: int = 4_194_304  # 2**26 characters / 16 tokens / ~1 char per token
    trees: dict[str, OrderedDict[int, float]] = field(default_factory=dict, init=False, repr=False)
    _last_eviction: float = field(default=0.0, init=False, repr=False)

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
        if (
            max_l - min_l > self.balance_abs_threshold
            and max_l > self.balance_rel_threshold * min_l
        ):
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
