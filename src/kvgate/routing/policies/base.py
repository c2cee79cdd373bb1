"""The policy interface (llm-d shape): filters → weighted scorers → picker → feedback.

A policy is any object with a ``name`` and ``choose(req, ctx) -> RouteDecision``. The
``RoutingContext`` hands it everything it may read for one decision — the eligible nodes
(already passed through the configured filters, ``filters.py``), their load scores, the
cache signal's matches (honouring flags and demotions), each node's predicted prefill
queueing delay, the route key's consistent-hash home node and cold boosts — so a policy
is a choice of weighted scorers (``scorers.py``) and a picker (``picker.py``). What
happens after the response (index, hit feedback, prefill queue) is the router's
post-response hooks (``routing/hooks.py``).

Adding a policy (e.g. the simulator's reference ``oracle``)::

    from kvgate.routing.policies import RoutingContext, register_policy

    class Oracle:
        name = "oracle"
        def choose(self, req: RouteRequest, ctx: RoutingContext) -> RouteDecision: ...

    register_policy("oracle", Oracle)

Then ``RoutingConfig(policy="oracle")`` validates and ``Router.set_policy("oracle")`` works.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Protocol

from kvgate.flags import Flags
from kvgate.routing.cache_signal import TokenCacheSignal
from kvgate.routing.known_policies import add_policy_name
from kvgate.routing.placement import Placements
from kvgate.routing.score_table import LoadScores
from kvgate.tokens import BLOCK_SIZE
from kvgate.types import RouteDecision, RouteRequest

if TYPE_CHECKING:
    from kvgate.routing.cache_signal import CacheSignal
    from kvgate.routing.config import RoutingConfig
    from kvgate.routing.consistent_hash import HashRing
    from kvgate.routing.feedback import HitFeedback
    from kvgate.routing.node_view import NodeEntry, NodeView
    from kvgate.routing.prefill_queue import PrefillModel, PrefillQueue


class Policy(Protocol):
    name: str

    def choose(self, req: RouteRequest, ctx: RoutingContext) -> RouteDecision:
        """Pick one of ``ctx.eligible``; called only when at least one node is eligible."""
        ...


PolicyFactory = Callable[[], Policy]
_REGISTRY: dict[str, PolicyFactory] = {}


def register_policy(name: str, factory: PolicyFactory) -> None:
    _REGISTRY[name] = factory
    add_policy_name(name)  # RoutingConfig(policy=name) validates from now on


def create_policy(name: str) -> Policy:
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown routing policy {name!r}; known: {sorted(_REGISTRY)}") from None
    return factory()


def policy_names() -> frozenset[str]:
    return frozenset(_REGISTRY)


def expected_tokens(matched_blocks: int, prompt_tokens: int) -> int:
    """Cached tokens an engine reuses for a matched prefix (a full hit recomputes the last block)."""
    usable = max(0, (prompt_tokens - 1) // BLOCK_SIZE)
    return min(matched_blocks, usable) * BLOCK_SIZE


class RoutingContext:
    """Everything one routing decision may read; built by the Router per request."""

    __slots__ = (
        "_boosts",
        "_delays",
        "_held",
        "_matches",
        "cache",
        "cache_is_precise",
        "config",
        "eligible",
        "feedback",
        "flags",
        "loads",
        "nodes",
        "now",
        "placements",
        "queue",
        "ring",
        "rng",
    )

    def __init__(
        self,
        *,
        config: RoutingConfig,
        flags: Flags,
        nodes: NodeView,
        cache: CacheSignal,
        ring: HashRing,
        feedback: HitFeedback,
        queue: PrefillQueue,
        rng: random.Random,
        placements: Placements | None = None,
        now: float,
        eligible: list[NodeEntry],
        loads: dict[str, float] | None = None,
    ) -> None:
        self.config = config
        self.flags = flags
        self.nodes = nodes
        self.cache = cache
        # set by a policy that swaps in the engines' own cache state (policy precise)
        self.cache_is_precise = False
        self.ring = ring
        self.feedback = feedback
        self.queue = queue
        self.placements = placements if placements is not None else Placements()
        self.rng = rng
        self.now = now
        self.eligible = eligible
        self.loads = loads if loads is not None else {e.spec.node_id: e.load for e in eligible}
        self._held: dict[str, int] | None = None
        self._matches: dict[str, int] | None = None
        self._boosts: dict[str, float] | None = None
        self._delays: dict[str, float] | None = None

    @property
    def node_ids(self) -> list[str]:
        return list(self.loads)

    @property
    def prefill(self) -> PrefillModel:
        return self.queue.model

    def _held_tokens(self, req: RouteRequest) -> dict[str, int]:
        """Eligible node → expected cached tokens by the cache signal: the decision's one
        lookup, shared by the scorers, the baselines' expected tokens and the
        decision-quality count."""
        if self._held is None:
            self._held = self._cached_tokens(req, self.loads) if req.block_hashes else {}
        return self._held

    def _trusted_matches(self, req: RouteRequest) -> dict[str, int]:
        matches: dict[str, int] = {}
        demotion = self.flags["hit_feedback"]
        for node_id, tokens in self._held_tokens(req).items():
            if tokens <= 0:
                continue
            if demotion and self.feedback.is_demoted(node_id, req.route_key):
                continue
            matches[node_id] = tokens
        return matches

    def prefix_matches(self, req: RouteRequest) -> dict[str, int]:
        """Eligible node → expected cached tokens (> 0 only); empty when affinity is off."""
        if self._matches is not None:
            return self._matches
        matches: dict[str, int] = {}
        if self.flags["cache_affinity"] and req.block_hashes:
            matches = self._trusted_matches(req)
        self._matches = matches
        return matches

    def known_matches(self, req: RouteRequest) -> dict[str, int]:
        """Eligible node → expected cached tokens as this decision knows them, whatever
        the flags: the policy's own matches where it read them (narrowed by its guesses),
        else the cache signal's (demoted pairs left out)."""
        if self._matches is not None and self.flags["cache_affinity"]:
            return self._matches
        return self._trusted_matches(req)

    @property
    def matches_read(self) -> bool:
        """Whether the policy read this decision's matches (a cache-aware policy)."""
        return self._matches is not None

    def restrict_matches(self, matches: dict[str, int]) -> dict[str, int]:
        """Replace this decision's matches (a policy's better guess: fewer nodes or
        shorter matches), for every scorer that reads them."""
        self._matches = matches
        return matches

    def expected_cached(self, req: RouteRequest, node_id: str) -> int:
        """Cached tokens the cache signal predicts on one node, whatever the flags."""
        if node_id in self.loads:
            return self._held_tokens(req).get(node_id, 0)
        if not req.block_hashes:  # not eligible: outside the decision's lookup
            return 0
        return self._cached_tokens(req, (node_id,)).get(node_id, 0)

    def _cached_tokens(self, req: RouteRequest, nodes: Collection[str]) -> dict[str, int]:
        """Expected cached tokens per node: the signal's own count where it has one (the
        engines' units), else its matched blocks as kvgate text-model tokens."""
        cache = self.cache
        if isinstance(cache, TokenCacheSignal):
            return cache.match_tokens(req, self.now, nodes)
        blocks = cache.match(req.block_hashes, self.now, nodes)
        return {n: expected_tokens(b, req.prompt_tokens) for n, b in blocks.items()}

    def queue_delays(self) -> dict[str, float]:
        """Predicted prefill queueing delay (seconds) per eligible node."""
        if self._delays is None:
            self._delays = self.queue.delays(list(self.loads), self.now)
        return self._delays

    def home_set(self, req: RouteRequest, k: int | None = None) -> list[str]:
        """The route key's bounded-load home set among eligible nodes; [] when hashing is off."""
        if not self.flags["consistent_hashing"]:
            return []
        size = k if k is not None else self.config.home_set_size
        return self.ring.home_set(req.route_key, size, self.loads, self.loads)

    def boosts(self) -> dict[str, float]:
        """Cold boost per eligible node (all 0 when the flag is off)."""
        if self._boosts is None:
            if self.flags["cold_boost"]:
                self._boosts = self.nodes.boosts(self.eligible)
            else:
                self._boosts = dict.fromkeys(self.loads, 0.0)
        return self._boosts

    def boost(self, node_id: str) -> float:
        return self.boosts().get(node_id, 0.0)

    def pick(self, scores: Mapping[str, float]) -> str:
        """Highest score; ties broken by lower load, then at random (injected rng)."""
        top = scores.top(1e-9) if isinstance(scores, LoadScores) else None
        if top is None:
            best = max(scores.values())
            top = [n for n, s in scores.items() if s >= best - 1e-9]
        if len(top) > 1:
            least = min(self.loads[n] for n in top)
            top = [n for n in top if self.loads[n] <= least + 1e-9]
        return top[0] if len(top) == 1 else self.rng.choice(top)

    def least_loaded(self, node_ids: Collection[str] | None = None) -> str:
        """Least load, less the cold boost (so new nodes warm up); ties at random."""
        ids = list(node_ids) if node_ids is not None else list(self.loads)
        weight = self.config.cold_boost_weight
        boosts, loads = self.boosts(), self.loads
        return self.pick({n: weight * boosts[n] - loads[n] for n in ids})
