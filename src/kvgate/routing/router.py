"""The Router facade: one object the gateway and the simulator both drive.

Sync, allocation-light and clock-injected: no asyncio, no I/O. A request with a ``pin``
goes to its pinned node or to none. The gateway calls
``route`` → ``on_dispatch`` → ``on_progress``* → ``on_complete`` for every attempt.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Collection, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from kvgate.clock import Clock
from kvgate.flags import Flags
from kvgate.routing.cache_signal import CacheSignal
from kvgate.routing.config import RoutingConfig
from kvgate.routing.consistent_hash import HashRing
from kvgate.routing.endpoints import cache_affine
from kvgate.routing.feedback import HitFeedback
from kvgate.routing.filters import eligible_nodes
from kvgate.routing.forgone import AFFINITY_OFF, DecisionQuality, cache_choice
from kvgate.routing.hooks import ResponseHooks
from kvgate.routing.metrics import RoutingMetrics, state_family
from kvgate.routing.node_view import NodeEntry, NodeView
from kvgate.routing.placement import Placements
from kvgate.routing.policies import Policy, RoutingContext, create_policy
from kvgate.routing.prefill_queue import PrefillModel, PrefillQueue
from kvgate.routing.prefix_index import PrefixIndex
from kvgate.types import NodeReport, NoNodeAvailable, RouteDecision, RoutePin, RouteRequest

# the route reason of a request pinned to the node holding its state (``RouteRequest.pin``)
PINNED_REASON = "previous_response"


class Router:
    def __init__(
        self,
        config: RoutingConfig,
        nodes: NodeView,
        *,
        flags: Flags | None = None,
        clock: Clock,
        registry: CollectorRegistry | None = None,
        rng: random.Random | None = None,
        cache_signal: CacheSignal | None = None,
    ) -> None:
        """``cache_signal``: where "which node holds this prefix" comes from; default the
        router's own approximate index (a precise, KV-event-fed index plugs in here)."""
        self.config = config
        self.nodes = nodes
        self.flags = flags if flags is not None else Flags()
        self.clock = clock
        self.rng = rng if rng is not None else random.Random()
        self.metrics = RoutingMetrics(registry)
        self.quality = DecisionQuality(self.metrics.registry)
        self.index = PrefixIndex(config.index_ttl_s, config.index_max_entries)
        self.cache_signal: CacheSignal = cache_signal if cache_signal is not None else self.index
        self.queue = PrefillQueue(PrefillModel(config.prefill_tokens_per_s, config.prefill_step_s))
        self.ring = HashRing(
            nodes.node_ids,
            virtual_nodes=config.virtual_nodes,
            load_factor=config.bounded_load_factor,
            cache_size=config.route_key_cache_size,
        )
        self.feedback = HitFeedback(
            shortfall_fraction=config.feedback_shortfall_fraction,
            demote_after=config.feedback_demote_after,
            ewma_alpha=config.feedback_ewma_alpha,
            max_entries=config.feedback_max_entries,
            demote_on_full_miss=config.feedback_demote_on_full_miss,
        )
        self.policy: Policy = create_policy(config.policy)
        # non-generation endpoints (embeddings, rerank, …): no prefix cache to follow
        self.least_load: Policy = create_policy("least_load")
        self.decision_counts: Counter[tuple[str, str]] = Counter()
        self.placements = Placements(config.index_ttl_s)
        self.hooks = ResponseHooks(
            self.index, self.feedback, self.queue, self.metrics, self.flags, self.placements
        )
        nodes.subscribe(
            on_add=self.ring.add_node,
            on_remove=self._node_removed,
            on_reregister=self._node_reregistered,
            on_report=self._node_reported,
        )
        self.metrics.add_live_collector(self._live_metrics)

    # -- policy ------------------------------------------------------------------------
    @property
    def policy_name(self) -> str:
        return self.policy.name

    def set_policy(self, name: str) -> None:
        self.policy = create_policy(name)

    # -- decisions ---------------------------------------------------------------------
    def route(self, req: RouteRequest, *, exclude: Collection[str] = ()) -> RouteDecision:
        now = self.clock.now()
        affine = cache_affine(req.endpoint)
        policy = self.policy if affine else self.least_load
        eligible, loads, dropped = eligible_nodes(self.nodes, req, self.config, now, exclude)
        if req.pin is not None:
            return self._pinned(req, req.pin, eligible, policy.name)
        if not eligible:
            self.metrics.no_node.labels(policy.name).inc()
            why = ", ".join(f"{k}={v}" for k, v in dropped.items() if v) or "no nodes configured"
            raise NoNodeAvailable(f"no eligible node ({why})")
        ctx = RoutingContext(
            config=self.config,
            flags=self.flags,
            nodes=self.nodes,
            cache=self.cache_signal,
            ring=self.ring,
            feedback=self.feedback,
            queue=self.queue,
            placements=self.placements,
            rng=self.rng,
            now=now,
            eligible=eligible,
            loads=loads,
        )
        decision = policy.choose(req, ctx)
        self.decision_counts[(decision.policy, decision.reason)] += 1
        self.metrics.child(self.metrics.decisions, decision.policy, decision.reason).inc()
        if affine:
            self._count_choice(req, ctx, decision)
        return decision

    def _count_choice(
        self, req: RouteRequest, ctx: RoutingContext, decision: RouteDecision
    ) -> None:
        """The cached tokens this decision gave up against the best eligible node."""
        choice = cache_choice(ctx.known_matches(req), decision.node_id)
        reason = decision.reason
        if not choice.took_best and ctx.matches_read and not self.flags["cache_affinity"]:
            reason = AFFINITY_OFF
        self.quality.record(choice, reason)

    def _pinned(
        self, req: RouteRequest, pin: RoutePin, eligible: list[NodeEntry], policy: str
    ) -> RouteDecision:
        """The pinned node if it may take the request now; no other node has its state."""
        if not any(e.spec.node_id == pin.node_id for e in eligible):
            self.metrics.no_node.labels(policy).inc()
            raise NoNodeAvailable(
                f"node {pin.node_id}, which holds the state this request continues, "
                "cannot take it now (not eligible, or already tried)"
            )
        decision = RouteDecision(
            pin.node_id, PINNED_REASON, pin.cached_tokens, policy, candidates=(pin.node_id,)
        )
        self.decision_counts[(decision.policy, decision.reason)] += 1
        self.metrics.child(self.metrics.decisions, decision.policy, decision.reason).inc()
        return decision

    def on_dispatch(self, req: RouteRequest, decision: RouteDecision) -> None:
        self.nodes.on_dispatch(decision.node_id, req.request_id, req.prompt_tokens)
        if decision.node_id in self.nodes:
            self.hooks.on_dispatch(req, decision, self.clock.now())

    def on_progress(
        self, req: RouteRequest, decision: RouteDecision, generated_tokens: int
    ) -> None:
        self.nodes.on_progress(decision.node_id, req.request_id, generated_tokens)
        if generated_tokens > 0:
            self.hooks.on_progress(req, decision, self.clock.now())

    def on_complete(
        self,
        req: RouteRequest,
        decision: RouteDecision,
        *,
        ok: bool,
        actual_cached_tokens: int | None,
    ) -> None:
        self.nodes.on_complete(decision.node_id, req.request_id)
        if decision.node_id not in self.nodes:
            return
        if ok:
            self.hooks.on_served(req, decision, actual_cached_tokens, self.clock.now())
        else:
            self.hooks.on_failed(req, decision, self.clock.now())

    # -- node events -------------------------------------------------------------------
    def _node_removed(self, node_id: str) -> None:
        self.ring.remove_node(node_id)
        self.index.purge_node(node_id)
        self.feedback.forget_node(node_id)
        self.queue.forget(node_id)
        self.placements.forget(node_id)

    def _node_reregistered(self, node_id: str) -> None:
        self.index.purge_node(node_id)
        self.feedback.forget_node(node_id)
        self.queue.forget(node_id)
        self.placements.forget(node_id)
        self.metrics.reregistrations.labels(node_id).inc()

    def _node_reported(self, node_id: str, report: NodeReport, dispatched_since: int) -> None:
        if not report.stale:
            idle = report.waiting <= 0 and dispatched_since == 0
            self.queue.on_report(node_id, self.clock.now(), idle=idle)

    # -- observability -----------------------------------------------------------------
    def _boost(self, node_id: str) -> float:
        return self.nodes.cold_boost(node_id) if self.flags["cold_boost"] else 0.0

    def _live_metrics(self) -> Iterator[GaugeMetricFamily]:
        entries = self.nodes.list()
        yield state_family({e.node_id: e.state for e in entries})
        index = GaugeMetricFamily("kvgate_prefix_index_entries", "(block, node) entries")
        index.add_metric([], float(len(self.index)))
        yield index
        boost = GaugeMetricFamily(
            "kvgate_cold_boost", "Cold-node routing boost (1 → 0 over warmup_s)", labels=["node"]
        )
        load = GaugeMetricFamily("kvgate_node_load", "Routing load score", labels=["node"])
        queue = GaugeMetricFamily(
            "kvgate_prefill_queue_seconds",
            "Predicted prefill queueing delay of a request dispatched now",
            labels=["node"],
        )
        prefixes = GaugeMetricFamily(
            "kvgate_node_prefixes",
            "Live route keys (prefixes) last placed on the node",
            labels=["node"],
        )
        kv_capacity = GaugeMetricFamily(
            "kvgate_node_kv_capacity_tokens",
            "The engine's KV cache capacity in tokens (as it reports it, else as configured)",
            labels=["node"],
        )
        now = self.clock.now()
        for e in entries:
            if (capacity := e.kv_capacity_tokens) is not None:
                kv_capacity.add_metric([e.node_id], float(capacity))
            boost.add_metric([e.node_id], self._boost(e.node_id))
            load.add_metric([e.node_id], e.load)
            queue.add_metric([e.node_id], self.queue.delay(e.node_id, now))
            prefixes.add_metric([e.node_id], float(self.placements.count(e.node_id)))
        yield boost
        yield load
        yield queue
        yield prefixes
        yield kv_capacity
        demoted = GaugeMetricFamily("kvgate_demoted_pairs", "(node, prefix) pairs demoted now")
        demoted.add_metric([], float(self.feedback.demoted_count()))
        yield demoted

    def snapshot(self) -> dict[str, Any]:
        """JSON-able view for the admin API and the dashboard."""
        nodes: dict[str, dict[str, Any]] = {}
        for e in self.nodes.list():
            report = e.report
            totals = self.feedback.nodes.get(e.node_id)
            nodes[e.node_id] = {
                "node_id": e.node_id,
                "state": e.state.value,
                "pool": e.spec.pool,
                "model": e.spec.model,
                "load": round(e.load, 4),
                "inflight_requests": e.inflight_requests,
                "inflight_tokens": e.inflight_tokens,
                "running": report.running if report else None,
                "waiting": report.waiting if report else None,
                "kv_usage": report.kv_usage if report else None,
                "kv_capacity_tokens": e.kv_capacity_tokens,
                "engine_prefix_hit_rate": report.prefix_hit_rate if report else None,
                "predicted_hit_rate": totals.predicted_hit_rate if totals else None,
                "actual_hit_rate": totals.actual_hit_rate if totals else None,
                "expected_cached_tokens": totals.expected_cached_tokens if totals else 0,
                "actual_cached_tokens": totals.actual_cached_tokens if totals else 0,
                "demotions": totals.demotions if totals else 0,
                "cold_boost": round(self._boost(e.node_id), 4),
                "prefill_queue_s": round(self.queue.delay(e.node_id, self.clock.now()), 4),
            }
        stats = self.index.stats()
        return {
            "policy": self.policy.name,
            "nodes": nodes,
            "decisions_total": {
                f"{policy}/{reason}": n
                for (policy, reason), n in sorted(self.decision_counts.items())
            },
            "prefix_index": {
                "entries": stats.entries,
                "blocks": stats.blocks,
                "evictions": stats.evictions,
                "expirations": stats.expirations,
                "max_entries": self.index.max_entries,
                "ttl_s": self.index.ttl_s,
            },
            "cache_choice": self.quality.snapshot(),
            "demoted_pairs": self.feedback.demoted_count(),
            "flags": self.flags.as_dict(),
        }
