from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Callable

import pytest
from prometheus_client import generate_latest

from kvgate.routing import RoutingContext, register_policy, route_request_from_tokens
from kvgate.tokens import block_hashes
from kvgate.types import NodeSpec, NodeState, NoNodeAvailable, RouteDecision, RoutePin, RouteRequest

from .conftest import Cluster, group_request

Factory = Callable[..., Cluster]


def test_first_request_goes_home_then_follows_its_cache(cluster_factory: Factory) -> None:
    c = cluster_factory()
    req = group_request(1, "a")
    first = c.router.route(req)
    assert first.reason == "home_set" and first.expected_cached_tokens == 0
    assert first.node_id in c.router.ring.home_set(req.route_key, 2)
    c.router.on_dispatch(req, first)
    c.router.on_complete(req, first, ok=True, actual_cached_tokens=0)
    again = c.router.route(group_request(1, "b"))
    assert (again.node_id, again.reason, again.expected_cached_tokens) == (
        first.node_id,
        "prefix_match",
        512,
    )


def test_groups_spread_at_concurrency_one(cluster_factory: Factory) -> None:
    for seed in range(5):
        c = cluster_factory(n=4, seed=seed)
        homes: dict[int, set[str]] = {}
        for rep in range(3):
            for group in range(8):
                homes.setdefault(group, set()).add(c.serve(group_request(group, f"{group}-{rep}")))
            c.clock.advance(1)
            c.report_all()
        assert all(len(nodes) == 1 for nodes in homes.values()), homes
        assert len({next(iter(n)) for n in homes.values()}) >= 3, homes


def test_miss_goes_to_least_loaded_not_emptiest_cache(cluster_factory: Factory) -> None:
    c = cluster_factory()
    c.flags.set("consistent_hashing", False)
    c.report("n0", running=6, kv_usage=0.0)  # empty cache but busy
    c.report("n1", running=0, kv_usage=0.4)  # holds cache, idle
    c.report("n2", running=3)
    c.report("n3", running=3)
    decision = c.router.route(group_request(5, "x"))
    assert (decision.node_id, decision.reason) == ("n1", "least_load_miss")


def test_hot_prefix_spreads_beyond_its_home_once_loaded(cluster_factory: Factory) -> None:
    c = cluster_factory()
    home = c.serve(group_request(9, "warm"))
    used: Counter[str] = Counter()
    for i in range(24):  # in flight together: nothing completes
        req = group_request(9, f"hot{i}")
        decision = c.router.route(req)
        c.router.on_dispatch(req, decision)
        used[decision.node_id] += 1
    assert used[home] >= 3  # affinity holds while the node has room
    assert len(used) >= 3  # then the load guard spills to other nodes
    assert max(used.values()) <= 12


def backlog(c: Cluster, node_id: str, tokens: int, tag: str) -> None:
    """Dispatch (not complete) a cold request of ``tokens`` to a node: a prefill backlog."""
    pieces = [f" {tag}w{i}" for i in range(tokens)]
    req = route_request_from_tokens(
        request_id=tag,
        model="m",
        prompt_tokens=tokens,
        block_hashes=block_hashes(pieces),
        route_key=f"m:{tag}",
        max_tokens=16,
    )
    c.router.on_dispatch(req, RouteDecision(node_id, "test", 0, "test"))


def test_spill_is_per_request_and_by_cost(cluster_factory: Factory) -> None:
    c = cluster_factory()
    owners = {g: c.serve(group_request(g, f"seed{g}")) for g in range(8)}
    hot = owners[0]
    # 512 cached tokens are worth 2 × 512 / 30800 s ≈ 33 ms (this request's prefill and
    # the work it adds elsewhere); 1200 queued tokens there cost ≈ 39 ms of waiting:
    # leave. 100 queued tokens (one 8 ms step): stay.
    backlog(c, hot, 1200, "bulk")
    spilled = c.router.route(group_request(0, "q"))
    assert spilled.node_id != hot and spilled.reason == "cost_spill"
    for g, node in owners.items():
        if node != hot:
            d = c.router.route(group_request(g, "q"))
            assert (d.node_id, d.reason) == (node, "prefix_match")  # others keep affinity
    c2 = cluster_factory()
    owner = c2.serve(group_request(0, "seed"))
    backlog(c2, owner, 100, "small")
    d = c2.router.route(group_request(0, "q"))
    assert (d.node_id, d.reason) == (owner, "prefix_match")


def test_flag_cache_affinity(cluster_factory: Factory) -> None:
    c = cluster_factory()
    req = group_request(3, "q")
    home = c.router.ring.home_set(req.route_key, 2)
    outsider = next(n for n in c.nodes.node_ids if n not in home)
    c.router.index.record(outsider, req.block_hashes, c.clock.now())
    assert c.router.route(req).node_id == outsider
    c.flags.set("cache_affinity", False)
    d = c.router.route(req)
    assert d.node_id in home and d.reason == "home_set"


def test_flag_consistent_hashing(cluster_factory: Factory) -> None:
    c = cluster_factory()
    req = group_request(4, "q")
    home = c.router.ring.home_set(req.route_key, 1)
    d = c.router.route(req)  # an idle, balanced cluster: a new prefix starts at home
    assert (d.node_id, d.reason) == (home[0], "home_set")
    c.flags.set("consistent_hashing", False)
    reasons = {c.router.route(group_request(4, f"q{i}")).reason for i in range(10)}
    assert reasons == {"least_load_miss"}


def test_flag_load_guard(cluster_factory: Factory) -> None:
    c = cluster_factory()
    c.flags.set("consistent_hashing", False)
    owner = c.serve(group_request(2, "seed"))
    backlog(c, owner, 4000, "bulk")
    assert c.router.route(group_request(2, "q")).node_id != owner
    c.flags.set("load_guard", False)
    d = c.router.route(group_request(2, "q"))
    assert (d.node_id, d.reason) == (owner, "prefix_match")  # affinity may overload


def test_flag_hit_feedback_and_demotion_restore(cluster_factory: Factory) -> None:
    c = cluster_factory(feedback_demote_on_full_miss=True)
    c.flags.set("consistent_hashing", False)
    owner = c.serve(group_request(6, "seed"))
    c.flags.set("hit_feedback", False)
    c.serve(group_request(6, "r1"), cached=0)  # a full miss, but feedback is off
    assert c.router.route(group_request(6, "r2")).node_id == owner
    c.flags.set("hit_feedback", True)
    decision = c.router.route(group_request(6, "r3"))
    assert decision.node_id == owner
    c.router.on_dispatch(group_request(6, "r3"), decision)
    c.router.on_complete(group_request(6, "r3"), decision, ok=True, actual_cached_tokens=0)
    assert c.router.feedback.is_demoted(owner, group_request(6, "x").route_key)
    after = c.router.route(group_request(6, "r4"))
    assert after.expected_cached_tokens == 0  # no longer promised anywhere
    # the demoted node serves the prefix again with real hits: restored
    c.router.on_dispatch(group_request(6, "r5"), RouteDecision(owner, "test", 0, "hybrid"))
    c.router.on_complete(
        group_request(6, "r5"),
        RouteDecision(owner, "test", 0, "hybrid"),
        ok=True,
        actual_cached_tokens=512,
    )
    assert not c.router.feedback.is_demoted(owner, group_request(6, "x").route_key)
    d = c.router.route(group_request(6, "r6"))
    assert (d.node_id, d.reason) == (owner, "prefix_match")
    text = generate_latest(c.router.metrics.registry).decode()
    assert f'kvgate_node_demotions_total{{node="{owner}"}} 1.0' in text


def test_flag_cold_boost_and_decay(cluster_factory: Factory) -> None:
    c = cluster_factory(n=3, warmup_s=600)
    c.flags.set("consistent_hashing", False)
    c.clock.advance(600)
    c.nodes.add_node(NodeSpec("new", "http://new"))
    c.report_all()
    boosted = Counter(c.router.route(group_request(100 + i, "q")).node_id for i in range(20))
    assert boosted["new"] == 20
    assert c.router.snapshot()["nodes"]["new"]["cold_boost"] == 1.0
    c.flags.set("cold_boost", False)
    plain = Counter(c.router.route(group_request(100 + i, "q")).node_id for i in range(20))
    assert plain["new"] < 15 and len(plain) >= 3
    c.flags.set("cold_boost", True)
    c.clock.advance(300)
    c.report_all()
    assert c.nodes.cold_boost("new") == pytest.approx(0.5)
    c.clock.advance(300)
    c.report_all()
    assert c.router.snapshot()["nodes"]["new"]["cold_boost"] == 0.0


def test_restart_purges_index_and_restarts_boost(cluster_factory: Factory) -> None:
    c = cluster_factory(warmup_s=100)
    c.report_all(process_start_time=1.0)
    owner = c.serve(group_request(1, "a"))
    c.clock.advance(200)
    assert c.nodes.cold_boost(owner) == 0.0
    c.report(owner, process_start_time=2.0)
    assert c.nodes.state_of(owner) == NodeState.REREGISTER
    assert c.router.index.match(group_request(1, "b").block_hashes, c.clock.now()) == {}
    assert c.nodes.cold_boost(owner) == 1.0
    c.report(owner, process_start_time=2.0)
    assert c.nodes.state_of(owner) == NodeState.HEALTHY


def test_states_filter_nodes(cluster_factory: Factory) -> None:
    c = cluster_factory(n=2, backoff_token_threshold=1000)
    c.nodes.set_state("n0", NodeState.BACKOFF)
    small = group_request(1, "s", prefix_blocks=2)  # 70 prompt + 16 max tokens
    big = group_request(1, "b", prefix_blocks=64)
    assert {c.router.route(big).node_id for _ in range(10)} == {"n1"}
    assert {c.router.route(small, exclude=("n1",)).node_id} == {"n0"}
    c.nodes.set_state("n1", NodeState.QUIESCING)
    with pytest.raises(NoNodeAvailable, match="backoff_size=1"):
        c.router.route(big)
    c.clock.advance(16)  # no reports: both unreachable
    c.nodes.set_state("n0", NodeState.HEALTHY)
    with pytest.raises(NoNodeAvailable, match="state=2"):
        c.router.route(small)


def test_quiescing_node_finishes_in_flight_work(cluster_factory: Factory) -> None:
    c = cluster_factory(n=2)
    req = group_request(1, "a")
    decision = c.router.route(req)
    c.router.on_dispatch(req, decision)
    c.nodes.set_state(decision.node_id, NodeState.QUIESCING)
    assert c.router.route(group_request(1, "b")).node_id != decision.node_id
    c.router.on_progress(req, decision, 10)
    assert c.nodes.get(decision.node_id).inflight_tokens == req.prompt_tokens + 10  # type: ignore[union-attr]
    c.router.on_complete(req, decision, ok=True, actual_cached_tokens=0)
    assert c.nodes.get(decision.node_id).inflight_requests == 0  # type: ignore[union-attr]


def test_failed_request_does_not_feed_the_index(cluster_factory: Factory) -> None:
    c = cluster_factory()
    req = group_request(1, "a")
    decision = c.router.route(req)
    c.router.on_dispatch(req, decision)
    c.router.on_complete(req, decision, ok=False, actual_cached_tokens=None)
    assert len(c.router.index) == 0
    assert c.nodes.get(decision.node_id).inflight_requests == 0  # type: ignore[union-attr]


def test_removed_node_leaves_ring_and_index(cluster_factory: Factory) -> None:
    c = cluster_factory()
    owner = c.serve(group_request(1, "a"))
    c.nodes.remove_node(owner)
    assert owner not in c.router.ring.nodes and len(c.router.index) == 0
    assert c.router.route(group_request(1, "b")).node_id != owner


@pytest.mark.parametrize(
    "policy",
    [
        "random",
        "round_robin",
        "least_request",
        "least_load",
        "consistent_hash",
        "cache_aware",
        "hybrid",
    ],
)
def test_every_builtin_policy_routes(cluster_factory: Factory, policy: str) -> None:
    c = cluster_factory(policy=policy)
    assert c.router.policy_name == policy
    nodes = {c.serve(group_request(g, "a")) for g in range(16)}
    assert nodes <= set(c.nodes.node_ids)
    assert c.router.route(group_request(0, "b"), exclude=("n0", "n1", "n2")).node_id == "n3"


def test_round_robin_cycles_and_least_request_balances(cluster_factory: Factory) -> None:
    c = cluster_factory(policy="round_robin")
    assert [c.router.route(group_request(1, "a")).node_id for _ in range(5)] == [
        "n0",
        "n1",
        "n2",
        "n3",
        "n0",
    ]
    c.router.set_policy("least_request")
    for i in range(8):
        req = group_request(1, f"r{i}")
        c.router.on_dispatch(req, c.router.route(req))
    assert all(e.inflight_requests == 2 for e in c.nodes.list())


def test_cache_aware_prefers_the_longest_match(cluster_factory: Factory) -> None:
    c = cluster_factory(policy="cache_aware")
    req = group_request(1, "a")
    c.router.index.record("n2", req.block_hashes[:5], c.clock.now())
    c.router.index.record("n3", req.block_hashes[:20], c.clock.now())
    d = c.router.route(req)
    assert (d.node_id, d.reason, d.expected_cached_tokens) == ("n3", "prefix_match", 320)


def test_custom_policy_plugs_in(cluster_factory: Factory) -> None:
    class LastNode:
        name = "test_last_node"

        def choose(self, req: RouteRequest, ctx: RoutingContext) -> RouteDecision:
            node_id = sorted(ctx.node_ids)[-1]
            return RouteDecision(node_id, "last", ctx.expected_cached(req, node_id), self.name)

    register_policy("test_last_node", LastNode)
    c = cluster_factory(policy="test_last_node")
    assert c.router.route(group_request(1, "a")).node_id == "n3"


def test_snapshot_and_metrics(cluster_factory: Factory) -> None:
    c = cluster_factory()
    c.report_all(running=1, kv_usage=0.25, prefix_hit_rate=0.5)
    for i in range(4):
        c.serve(group_request(1, f"r{i}"))
    snap = c.router.snapshot()
    json.dumps(snap)
    node = next(v for v in snap["nodes"].values() if v["actual_cached_tokens"])
    assert node["predicted_hit_rate"] == node["actual_hit_rate"] > 0
    assert node["engine_prefix_hit_rate"] == 0.5 and node["kv_usage"] == 0.25
    assert snap["decisions_total"] == {"hybrid/home_set": 1, "hybrid/prefix_match": 3}
    assert snap["prefix_index"]["entries"] == len(c.router.index) > 0
    text = generate_latest(c.router.metrics.registry).decode()
    for name in (
        'kvgate_route_decisions_total{policy="hybrid",reason="prefix_match"} 3.0',
        "kvgate_route_expected_cached_tokens_total",
        "kvgate_route_actual_cached_tokens_total",
        'kvgate_node_state{node="n0",state="healthy"} 1.0',
        "kvgate_prefix_index_entries",
        "kvgate_prefix_index_evictions_total",
        'kvgate_cold_boost{node="n0"}',
        'kvgate_prefill_queue_seconds{node="n0"}',
        "kvgate_node_prefixes",
    ):
        assert name in text, name
    # a dispatched, unfinished request is prefill backlog until it is seen past prefill
    req = group_request(2, "open")
    d = c.router.route(req)
    c.router.on_dispatch(req, d)
    assert c.router.snapshot()["nodes"][d.node_id]["prefill_queue_s"] > 0
    c.router.on_progress(req, d, 1)
    assert c.router.snapshot()["nodes"][d.node_id]["prefill_queue_s"] == 0


def test_index_evictions_are_counted(cluster_factory: Factory) -> None:
    c = cluster_factory(index_max_entries=100)
    for g in range(10):
        c.serve(group_request(g, "a"))
    assert len(c.router.index) <= 100
    text = generate_latest(c.router.metrics.registry).decode()
    assert f"kvgate_prefix_index_evictions_total {float(c.router.index.evictions)}" in text
    assert c.router.index.evictions > 0


def test_different_users_with_one_system_prompt_share_candidates(cluster_factory: Factory) -> None:
    from kvgate.routing import build_route_request

    c = cluster_factory()
    system = "You are the billing assistant. " * 40

    def request(user: str, question: str) -> RouteRequest:
        body = {
            "model": "m",
            "user": user,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": question},
            ],
        }
        return build_route_request(
            body,
            endpoint="chat",
            headers={"Authorization": f"Bearer key-{user}"},
            request_id=user,
            tenant=user,
            priority=0,
            config=c.config.route_key,
        )

    alice, bob = request("alice", "Where is my invoice?"), request("bob", "Cancel my plan.")
    assert alice.route_key == bob.route_key
    owner = c.serve(alice)
    d = c.router.route(bob)
    assert (d.node_id, d.reason) == (owner, "prefix_match") and d.expected_cached_tokens > 0
    assert set(d.candidates) >= {owner}


def test_prefill_queue_drains_and_follows_observations(cluster_factory: Factory) -> None:
    c = cluster_factory()
    owner = c.serve(group_request(7, "seed"))
    backlog(c, owner, 3000, "bulk")
    assert c.router.route(group_request(7, "q")).reason == "cost_spill"
    c.clock.advance(0.2)  # 3000 tokens drain in ≈ 0.1 s at the default rate
    assert c.router.route(group_request(7, "q")).reason == "prefix_match"
    backlog(c, owner, 30000, "huge")  # ≈ 1 s of prefill queued
    assert c.router.route(group_request(7, "q")).reason == "cost_spill"
    # a report taken while that dispatch may still be in transit proves nothing ...
    c.report(owner, waiting=0, running=1)
    assert c.router.route(group_request(7, "q")).reason == "cost_spill"
    # ... the next one, with nothing waiting and nothing dispatched since, does
    c.report(owner, waiting=0, running=1)
    assert c.router.route(group_request(7, "q")).reason == "prefix_match"


def test_ties_break_by_load_then_at_random(cluster_factory: Factory) -> None:
    c = cluster_factory()
    c.report("n0", running=1)
    c.router.route(group_request(1, "probe"))  # builds nothing persistent
    from kvgate.routing.filters import eligible_nodes

    eligible, loads, _ = eligible_nodes(c.nodes, group_request(1, "x"), c.config, c.clock.now())
    ctx = RoutingContext(
        config=c.config,
        flags=c.flags,
        nodes=c.nodes,
        cache=c.router.index,
        ring=c.router.ring,
        feedback=c.router.feedback,
        queue=c.router.queue,
        rng=c.router.rng,
        now=c.clock.now(),
        eligible=eligible,
        loads=loads,
    )
    picks = Counter(ctx.pick(dict.fromkeys(loads, 1.0)) for _ in range(200))
    assert "n0" not in picks  # same score, higher load
    assert set(picks) == {"n1", "n2", "n3"}  # the rest share the tie at random


def test_no_nodes_at_all(cluster_factory: Factory) -> None:
    c = cluster_factory(n=0)
    with pytest.raises(NoNodeAvailable, match="no nodes configured"):
        c.router.route(group_request(1, "a"))
    text = generate_latest(c.router.metrics.registry).decode()
    assert 'kvgate_route_no_node_total{policy="hybrid"} 1.0' in text


def test_filters_compose_from_config(cluster_factory: Factory) -> None:
    with pytest.raises(ValueError, match="filters: unknown nope"):
        cluster_factory(filters=["state", "nope"])
    strict = cluster_factory(n=0)
    strict.nodes.add_node(NodeSpec("other", "http://other", model="other-model"))
    req = group_request(1, "q")  # asks for model "m"
    with pytest.raises(NoNodeAvailable, match="model=1"):
        strict.router.route(req)
    lax = cluster_factory(n=0, filters=["state"])
    lax.nodes.add_node(NodeSpec("other", "http://other", model="other-model"))
    assert lax.router.route(req).node_id == "other"  # the model filter is not configured


def test_router_takes_another_cache_signal(cluster_factory: Factory) -> None:
    from kvgate.routing import PrefixIndex, Router

    c = cluster_factory()
    precise = PrefixIndex()  # e.g. fed by engine KV events instead of routed requests
    router = Router(c.config, c.nodes, flags=c.flags, clock=c.clock, cache_signal=precise)
    seen = group_request(2, "seen").block_hashes  # the group's 32-block prefix + a tail
    router.index.record("n1", seen, c.clock.now())  # the guess says n1 ...
    precise.record("n3", seen, c.clock.now())  # ... the engine says n3
    d = router.route(group_request(2, "q"))
    assert (d.node_id, d.reason, d.expected_cached_tokens) == ("n3", "prefix_match", 512)


def test_new_prefixes_are_placed_evenly(cluster_factory: Factory) -> None:
    c = cluster_factory(n=4)
    placed: Counter[str] = Counter()
    for group in range(12):  # all in flight at once: nothing completes
        req = group_request(group, f"first{group}")
        d = c.router.route(req)
        c.router.on_dispatch(req, d)
        placed[d.node_id] += 1
        c.clock.advance(1.0)  # each prefill drains before the next prefix arrives
    assert sorted(placed.values()) == [3, 3, 3, 3]
    # and each group's next request follows its prefix, not the balance
    for group in range(12):
        d = c.router.route(group_request(group, f"next{group}"))
        assert d.reason == "prefix_match"


def test_decode_cost_spills_off_a_node_whose_sequence_slots_are_full(
    cluster_factory: Factory,
) -> None:
    """CPU-like profile: 14 ms per running sequence per step, 8 sequence slots. A node
    with every slot taken and requests waiting makes a cached request wait for decodes
    to finish, which costs more than re-prefilling its prefix elsewhere."""
    cpu = {"decode_seq_s": 0.0141, "max_running": 8, "prefill_tokens_per_s": 320.0}

    def chat(rid: str) -> RouteRequest:  # 512 cached tokens ≈ 3.2 s of prefill here
        return dataclasses.replace(group_request(0, rid), max_tokens=256)

    c = cluster_factory(**cpu)
    owner = c.serve(chat("seed"))
    c.report(owner, running=8, waiting=2)
    d = c.router.route(chat("q"))
    assert d.node_id != owner and d.reason == "cost_spill"
    # a few sequences running (free slots): their step cost is far below the prefix's
    c.report(owner, running=3, waiting=0)
    d = c.router.route(chat("q2"))
    assert (d.node_id, d.reason) == (owner, "prefix_match")
    # the same full node, decode cost not modelled (the default): affinity holds
    c2 = cluster_factory(prefill_tokens_per_s=320.0)
    owner2 = c2.serve(chat("seed"))
    c2.report(owner2, running=8, waiting=2)
    assert c2.router.route(chat("q")).node_id == owner2


def test_pinned_request_goes_to_its_node_or_to_none(cluster_factory: Factory) -> None:
    c = cluster_factory(n=3)
    c.report_all()
    warm = group_request(1, "w")
    home = c.serve(warm)
    other = next(n for n in c.nodes.node_ids if n != home)
    follow = group_request(1, "f")  # its prefix is cached on ``home``…
    follow.pin = RoutePin(other, cached_tokens=48)  # …but its state is on ``other``
    decision = c.router.route(follow)
    assert (decision.node_id, decision.reason) == (other, "previous_response")
    assert decision.expected_cached_tokens == 48 and decision.candidates == (other,)
    with pytest.raises(NoNodeAvailable, match=f"node {other}"):
        c.router.route(follow, exclude=(other,))  # tried: no other node has the state
    c.nodes.set_state(other, NodeState.QUIESCING)
    with pytest.raises(NoNodeAvailable, match=f"node {other}"):
        c.router.route(follow)
