"""Routing-decision quality on the real router and prefix index: the cached tokens a
decision gave up against the best eligible node, and the share that took the best."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from kvgate.kv_events.index import PreciseIndex
from kvgate.kv_events.metrics import KvEventMetrics
from kvgate.kv_events.signal import PreciseSignal, bind_signal, unbind_signal
from kvgate.kv_events.wire import BlockStored, KVEventBatch
from kvgate.routing.forgone import CacheChoice, cache_choice

from .conftest import Cluster, group_request
from .test_router import backlog

Factory = Callable[..., Cluster]
PREFIX = 32 * 16  # a group's shared prefix: the expected cached tokens of a full match


def quality(c: Cluster) -> dict[str, Any]:
    return c.router.snapshot()["cache_choice"]


def sample(c: Cluster, name: str, labels: dict[str, str] | None = None) -> float:
    registry: CollectorRegistry = c.router.metrics.registry
    return registry.get_sample_value(name, labels or {}) or 0.0


def test_choice_arithmetic() -> None:
    assert cache_choice({}, "n0") == CacheChoice(0, 0)
    choice = cache_choice({"n0": 512, "n1": 128}, "n1")
    assert (choice.best, choice.chosen, choice.forgone, choice.took_best) == (512, 128, 384, False)
    assert cache_choice({"n0": 512, "n1": 512}, "n1").took_best


def test_load_guard_spill_counts_the_tokens_it_left(cluster_factory: Factory) -> None:
    c = cluster_factory()
    owner = c.serve(group_request(0, "seed"))
    backlog(c, owner, 1200, "bulk")
    spilled = c.router.route(group_request(0, "q"))
    assert spilled.node_id != owner and spilled.reason == "cost_spill"
    q = quality(c)
    assert q["decisions"] == 2 and q["took_best"] == 1 and q["took_best_share"] == 0.5
    assert q["with_cached_prefix"] == 1 and q["best_tokens"] == PREFIX
    assert q["forgone_tokens"] == PREFIX - spilled.expected_cached_tokens == PREFIX
    assert q["forgone_tokens_by_reason"] == {"cost_spill": PREFIX}
    assert q["left_best_by_reason"] == {"cost_spill": 1}
    forgone = "kvgate_route_cache_forgone_tokens_total"
    assert sample(c, forgone, {"reason": "cost_spill"}) == PREFIX
    best = "kvgate_route_cache_best_decisions_total"
    assert sample(c, best, {"took_best": "true"}) == 1
    assert sample(c, best, {"took_best": "false"}) == 1
    assert sample(c, "kvgate_route_cache_best_tokens_total") == PREFIX


def test_pure_affinity_takes_the_best_node_every_time(cluster_factory: Factory) -> None:
    c = cluster_factory(n=4)
    for rep in range(3):
        for group in range(6):
            c.serve(group_request(group, f"{group}-{rep}"))
        c.clock.advance(1)
        c.report_all()
    q = quality(c)
    assert q["decisions"] == 18 and q["took_best"] == 18 and q["took_best_share"] == 1.0
    assert q["with_cached_prefix"] == 12 and q["best_tokens"] == 12 * PREFIX
    assert q["forgone_tokens"] == 0 and q["forgone_tokens_by_reason"] == {}


def test_round_robin_gives_up_the_cached_node(cluster_factory: Factory) -> None:
    c = cluster_factory(n=2, policy="round_robin")
    first = c.serve(group_request(1, "a"))
    second = c.router.route(group_request(1, "b"))
    assert second.node_id != first and second.reason == "round_robin"
    third = c.router.route(group_request(1, "c"))
    assert third.node_id == first and third.expected_cached_tokens == PREFIX
    q = quality(c)
    assert q["decisions"] == 3 and q["took_best"] == 2
    assert q["forgone_tokens_by_reason"] == {"round_robin": PREFIX}


def test_cache_affinity_off_is_its_own_reason(cluster_factory: Factory) -> None:
    c = cluster_factory()
    req = group_request(3, "q")
    home = c.router.ring.home_set(req.route_key, 2)
    outsider = next(n for n in c.nodes.node_ids if n not in home)
    c.router.index.record(outsider, req.block_hashes, c.clock.now())  # the whole prompt
    c.flags.set("cache_affinity", False)
    d = c.router.route(req)
    assert d.node_id in home and d.reason == "home_set" and d.expected_cached_tokens == 0
    assert quality(c)["forgone_tokens_by_reason"] == {"cache_affinity_off": 34 * 16}


def test_excluded_and_demoted_nodes_are_not_the_best(cluster_factory: Factory) -> None:
    c = cluster_factory()
    owner = c.serve(group_request(2, "seed"))
    c.serve(group_request(2, "retry"), exclude=(owner,))  # a retry: the owner was tried
    q = quality(c)
    assert q["decisions"] == 2 and q["took_best"] == 2 and q["with_cached_prefix"] == 0
    c2 = cluster_factory(feedback_demote_on_full_miss=True, feedback_demote_after=1)
    owner = c2.serve(group_request(4, "seed"))
    c2.serve(group_request(4, "miss"), cached=0)  # the engine had nothing: demoted
    assert c2.router.feedback.is_demoted(owner, group_request(4, "x").route_key)
    c2.router.route(group_request(4, "after"))
    q = quality(c2)
    assert q["took_best"] == q["decisions"] == 3 and q["forgone_tokens"] == 0


def test_non_generate_requests_are_not_counted(cluster_factory: Factory) -> None:
    import dataclasses

    c = cluster_factory()
    c.serve(group_request(5, "seed"))
    c.router.route(dataclasses.replace(group_request(5, "emb"), endpoint="embeddings"))
    assert quality(c)["decisions"] == 1


def test_precise_state_counts_against_engine_truth() -> None:
    c = Cluster(n=3, policy="precise")
    c.report_all(running=1)
    signal = PreciseSignal(PreciseIndex(), KvEventMetrics())
    bind_signal(c.nodes, signal)
    try:
        req = group_request(6, "r")
        for node in c.nodes.node_ids:
            signal.index.apply(node, KVEventBatch(0.0, []), 0.0)
        # the engine of n1 holds the whole prefix, n2 a quarter of it
        signal.index.apply("n1", KVEventBatch(0.0, [BlockStored(req.block_hashes[:32], None)]), 0.0)
        signal.index.apply("n2", KVEventBatch(0.0, [BlockStored(req.block_hashes[:8], None)]), 0.0)
        d = c.router.route(req)
        assert (d.node_id, d.reason) == ("n1", "precise_match")
        backlog(c, "n1", 30000, "bulk")
        spilled = c.router.route(group_request(6, "s"))
        assert spilled.reason == "cost_spill" and spilled.node_id != "n1"
        q = quality(c)
        assert q["decisions"] == 2 and q["took_best"] == 1 and q["took_best_share"] == 0.5
        assert q["forgone_tokens_by_reason"] == {
            "cost_spill": PREFIX - spilled.expected_cached_tokens
        }
    finally:
        unbind_signal(c.nodes)


def test_the_simulator_reports_it_per_policy() -> None:
    from kvgate.sim.cluster import SimConfig, run_comparison
    from kvgate.workloads.catalog import generate_at_load

    workload = generate_at_load("multi-turn", "normal", seed=1, requests=200, rate=None)
    results = run_comparison(workload, SimConfig(nodes=4, seed=1), ["round_robin", "hybrid"])
    rr, hybrid = results["round_robin"].cache_choice, results["hybrid"].cache_choice
    for result in results.values():
        assert result.cache_choice["decisions"] == len(result.records) == 200
    assert rr["forgone_tokens"] > 0 and set(rr["forgone_tokens_by_reason"]) == {"round_robin"}
    assert rr["took_best_share"] < hybrid["took_best_share"]
    assert hybrid["forgone_tokens"] < rr["forgone_tokens"]
