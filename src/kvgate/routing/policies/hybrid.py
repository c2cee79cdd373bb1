"""Cache-aware policies: ``hybrid`` (the default) and ``cache_aware`` (no home node).

Both score every eligible node in seconds of predicted TTFT (``routing/scorers.py``):

    score(n) = cached_tokens(n) / prefill_rate − queue_delay(n) − decode_delay(n) + cold boost

(``decode_delay``: what the node's running sequences add — their per-sequence step cost
and, with every sequence slot taken, the wait for one to free up; modelled only when
the engine profile's ``decode_seq_s`` / ``max_running`` are configured)

and keep the request's *affine* node unless another node scores higher by more than
``spill_margin_s``. So a request leaves its cache only when the expected queueing delay
there exceeds the cost of re-prefilling the prefix elsewhere — a cost comparison, not a
fixed load ratio. The affine node is the node holding the longest cached prefix (a
conversation's next turn goes where its history is cached). With no cached prefix
anywhere the request goes to the best score — the least predicted TTFT, ties to the
least-loaded node — never "the emptiest cache"; hybrid breaks that tie toward the route
key's consistent-hash home node, so replicas that share no index agree on where a new
prefix starts while the cluster is balanced. (Sending every miss to the home node
instead cost 1–2 points of hit rate and doubled load CV in the simulator: ring
placement of a few dozen keys is lumpier than least-load placement.)

An index match is trusted only as far as the blocks a per-node LRU shadow (``ShadowLRU``:
the blocks this gateway sent to the node, kept to its KV capacity, tail blocks evicted
first as an engine frees them) still holds: the index remembers a prefix for its TTL, the
engine only while newer blocks have not pushed it out. A request whose every index match
is gone so is placed as a new prefix with reason ``evicted_miss``. With a precise cache
signal (policy ``precise``, every node synced on its KV events) the guess is off.

Flags: ``eviction_guess`` off → every index match is trusted; ``cache_affinity`` off → no cache term and no cached affine node;
``consistent_hashing`` off → no home node; ``load_guard`` off → no queue or decode term, so
affinity is never left (plain affinity); ``cold_boost`` off → no boost.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from kvgate.routing.picker import pick_with_preference
from kvgate.routing.policies.base import RoutingContext, expected_tokens
from kvgate.routing.prefix_index import PrefixIndex
from kvgate.routing.scorers import weighted_score_map
from kvgate.tokens import BLOCK_SIZE
from kvgate.types import RouteDecision, RouteRequest

HOT_TRAFFIC = 1.25
# the shadow's blocks never expire (finite: the index reads an absent block as -inf old)
_NO_TTL = sys.float_info.max


class ShadowLRU:
    """Per node, the prompt blocks this gateway sent there, least recently sent first,
    kept to the node's KV capacity. The engine holds at most that many blocks and
    evicts the least recently used, so a block pushed out here has been evicted there
    (short of a request still running on it, or traffic from another gateway): a match
    the index still lists on such a block is dropped.

    Each node's shadow is a ``PrefixIndex`` of its own with no TTL, bounded to the node's
    capacity in blocks: the index already keeps a per-block LRU (a chain touched deepest
    first, so a prefix outlives its tail) and stores it as runs, so a record costs per
    run on the prompt's path, not per block."""

    def __init__(self) -> None:
        self._nodes: dict[str, PrefixIndex] = {}

    def record(self, node_id: str, hashes: list[int], capacity_blocks: int) -> None:
        shadow = self._nodes.get(node_id)
        if shadow is None:
            shadow = self._nodes[node_id] = PrefixIndex(_NO_TTL, capacity_blocks)
        else:
            shadow.max_entries = capacity_blocks  # the next record evicts down to it
        shadow.record(node_id, hashes, 0.0)  # no TTL: the order of calls is the LRU order

    def held(self, node_id: str, hashes: list[int], upto: int | None = None) -> int | None:
        """Leading blocks of ``hashes`` (at most ``upto``) still held; None: nothing
        recorded for the node."""
        shadow = self._nodes.get(node_id)
        if shadow is None:
            return None
        if upto is not None and upto < len(hashes):
            hashes = hashes[:upto]
        return shadow.match(hashes, 0.0).get(node_id, 0)


def _capacity_blocks(ctx: RoutingContext, node_id: str) -> int | None:
    entry = ctx.nodes.get(node_id)
    if entry is None:
        return None
    tokens = entry.kv_capacity_tokens
    return tokens // BLOCK_SIZE if tokens else None


def _affine_by_cache(matches: dict[str, int], scores: Mapping[str, float], home: list[str]) -> str:
    """The node with the longest cached prefix; ties to the home node, then the best score."""
    longest = max(matches.values())
    tied = [n for n, t in matches.items() if t == longest]
    if len(tied) == 1:
        return tied[0]
    for n in home:
        if n in tied:
            return n
    return max(tied, key=lambda n: scores[n])


def place_new_prefix(
    ctx: RoutingContext, scores: Mapping[str, float], home: list[str], within: float | None = None
) -> str:
    """Where a prefix nobody holds starts. A new prefix brings its future requests along,
    so among nodes within one engine step (``within``: a policy's own estimate of its
    noise) of the best predicted TTFT it goes to the one
    holding the fewest live prefixes, then the least recent traffic, then the home node."""
    best = max(scores.values())
    slack = ctx.prefill.step_s if within is None else within
    near = [n for n, s in scores.items() if s >= best - slack]
    # a node already carrying a hot prefix (well above the mean recent traffic) takes no
    # new one: prefix counts alone would give it as many prefixes as any other node
    traffic_all = ctx.queue.traffics(near, ctx.now)
    mean = sum(traffic_all.values()) / len(near)
    calm = [n for n in near if traffic_all[n] <= HOT_TRAFFIC * mean + 1.0]
    near = calm or near
    counts = ctx.placements.counts(near)
    fewest = min(counts)
    near = [n for n, c in zip(near, counts, strict=True) if c == fewest]
    traffic = {n: traffic_all[n] for n in near}
    least = min(traffic.values())
    quiet = [n for n in near if traffic[n] <= least + 0.5]
    for n in home:
        if n in quiet:
            return n
    return ctx.pick({n: -traffic[n] for n in quiet})


class HybridPolicy:
    name = "hybrid"
    use_home = True

    def __init__(self) -> None:
        self.shadow = ShadowLRU()

    @staticmethod
    def _shadow_on(ctx: RoutingContext) -> bool:
        # off while the cache signal is the engines' own (policy precise, every node
        # synced): it knows evictions, no guess on top of it
        return ctx.flags["eviction_guess"] and not ctx.cache_is_precise

    def _not_evicted(
        self, req: RouteRequest, ctx: RoutingContext, matches: dict[str, int]
    ) -> dict[str, int]:
        out: dict[str, int] = {}
        for node_id, tokens in matches.items():
            held = self.shadow.held(node_id, req.block_hashes, tokens // BLOCK_SIZE)
            if held is not None:
                tokens = min(tokens, expected_tokens(held, req.prompt_tokens))
            if tokens > 0:
                out[node_id] = tokens
        return out

    def choose(self, req: RouteRequest, ctx: RoutingContext) -> RouteDecision:
        cfg = ctx.config
        weights = {
            "cache": cfg.cache_weight,
            "queue": 1.0,
            "decode": 1.0 if cfg.decode_seq_s > 0.0 else 0.0,  # 0: not computed
            "cold_boost": cfg.cold_boost_weight,
            "load": cfg.load_weight,
        }
        matches = ctx.prefix_matches(req)
        evicted = False
        if matches and self._shadow_on(ctx):
            matches = ctx.restrict_matches(self._not_evicted(req, ctx, matches))
            evicted = not matches  # the index's every match is gone from its engine
        scores = weighted_score_map(req, ctx, weights)
        home = ctx.home_set(req) if self.use_home else []
        if matches:
            affine = _affine_by_cache(matches, scores, home)
            node_id, spilled = pick_with_preference(ctx, scores, affine, cfg.spill_margin_s)
        else:
            node_id, spilled = place_new_prefix(ctx, scores, home), False
        if self._shadow_on(ctx):
            cap = _capacity_blocks(ctx, node_id)
            if cap:
                self.shadow.record(node_id, req.block_hashes, cap)
        expected = matches.get(node_id, 0)
        if spilled:
            reason = "cost_spill"
        elif expected > 0:
            reason = "prefix_match"
        elif evicted:
            reason = "evicted_miss"  # counted by kvgate_route_decisions_total
        else:
            reason = "home_set" if home and node_id == home[0] else "least_load_miss"
        candidates = tuple(dict.fromkeys([*matches, *home]))
        return RouteDecision(node_id, reason, expected, self.name, candidates)


class CacheAwarePolicy(HybridPolicy):
    """hybrid without the home-node tie-break."""

    name = "cache_aware"
    use_home = False
