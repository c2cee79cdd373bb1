"""Post-dispatch and post-response hooks: what the router learns from each request.

At dispatch, the prefix index records the request's blocks on the chosen node (the
engine is about to compute them; a request for the same prefix arriving while this one
is in flight must find them — recording only at completion scattered a new prefix over
several nodes) and the node's prefill queue grows by the request's uncached tokens.
After the response, hit feedback compares the expected with the engine's actual cached
tokens (metrics and (node, prefix) demotion), and the index is refreshed — or, for a
failed attempt, forgets the blocks this attempt would have added.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvgate.flags import Flags
from kvgate.routing.endpoints import cache_affine
from kvgate.routing.feedback import HitFeedback
from kvgate.routing.metrics import RoutingMetrics
from kvgate.routing.placement import Placements
from kvgate.routing.prefill_queue import PrefillQueue
from kvgate.routing.prefix_index import PrefixIndex
from kvgate.tokens import BLOCK_SIZE
from kvgate.types import RouteDecision, RouteRequest


@dataclass(eq=False)
class ResponseHooks:
    index: PrefixIndex
    feedback: HitFeedback
    queue: PrefillQueue
    metrics: RoutingMetrics
    flags: Flags
    placements: Placements
    _evictions_seen: int = field(default=0, init=False, repr=False)

    def on_dispatch(self, req: RouteRequest, decision: RouteDecision, now: float) -> None:
        # expected cached tokens are the engine's when it hashed the prompt (policy precise)
        prompt = req.engine_prompt_tokens or req.prompt_tokens
        uncached = max(0, prompt - decision.expected_cached_tokens)
        self.queue.on_dispatch(decision.node_id, req.request_id, uncached, now)
        if not cache_affine(req.endpoint):
            return  # no prefix to place (embeddings, rerank, …)
        self.index.record(decision.node_id, req.block_hashes, now)
        self.placements.on_dispatch(req.route_key, decision.node_id, now)
        self._count_evictions()

    def on_progress(self, req: RouteRequest, decision: RouteDecision, now: float) -> None:
        self.queue.on_prefilled(decision.node_id, req.request_id, now)

    def on_failed(self, req: RouteRequest, decision: RouteDecision, now: float) -> None:
        """The attempt computed nothing: forget the blocks it would have added."""
        self.queue.on_prefilled(decision.node_id, req.request_id, now)
        known = decision.expected_cached_tokens // BLOCK_SIZE
        self.index.drop(decision.node_id, req.block_hashes, start=known)

    def on_served(
        self,
        req: RouteRequest,
        decision: RouteDecision,
        actual_cached_tokens: int | None,
        now: float,
    ) -> None:
        """The node answered; ``actual_cached_tokens`` is the engine's figure, if it gave one."""
        node_id = decision.node_id
        self.queue.on_prefilled(node_id, req.request_id, now)
        if not cache_affine(req.endpoint):
            return  # nothing was predicted, nothing is cached
        metrics = self.metrics
        if actual_cached_tokens is not None:
            child = metrics.child
            child(metrics.expected_cached, node_id).inc(decision.expected_cached_tokens)
            child(metrics.actual_cached, node_id).inc(actual_cached_tokens)
            if decision.expected_cached_tokens > 0:
                child(metrics.hit_ratio, node_id).observe(
                    actual_cached_tokens / decision.expected_cached_tokens
                )
        change = self.feedback.record(
            node_id,
            req.route_key,
            expected_cached_tokens=decision.expected_cached_tokens,
            actual_cached_tokens=actual_cached_tokens,
            # the engine's count when it hashed the prompt: the unit of its cached tokens
            prompt_tokens=req.engine_prompt_tokens or req.prompt_tokens,
            demotion_enabled=self.flags["hit_feedback"],
        )
        if change == "demoted":
            metrics.child(metrics.demotions, node_id).inc()
            # The node keeps losing what the index says it holds: forget it there.
            self.index.drop(node_id, req.block_hashes)
        else:
            if change == "restored":
                metrics.child(metrics.restorations, node_id).inc()
            self.index.record(node_id, req.block_hashes, now)
        self._count_evictions()

    def _count_evictions(self) -> None:
        evictions = self.index.evictions
        if evictions > self._evictions_seen:
            self.metrics.evictions.inc(evictions - self._evictions_seen)
            self._evictions_seen = evictions
