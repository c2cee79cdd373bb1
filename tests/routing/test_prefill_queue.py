"""The prefill ledger's model: a step's fixed cost and its compute overlap."""

from __future__ import annotations

from kvgate.routing.prefill_queue import PrefillModel, PrefillQueue


def test_a_small_prefill_takes_one_step_not_a_step_plus_its_compute() -> None:
    model = PrefillModel(tokens_per_s=30_000.0, step_s=0.008)
    assert model.prefill_s(0) == 0.008
    assert model.prefill_s(150) == 0.008  # 5 ms of compute inside an 8 ms step
    assert model.prefill_s(3_000) == 0.1  # compute-bound: the step cost is inside it


def test_the_queue_delay_is_the_sum_of_the_dispatched_prefills() -> None:
    q = PrefillQueue(PrefillModel(tokens_per_s=30_000.0, step_s=0.008))
    q.on_dispatch("a", "r1", 150, now=0.0)
    q.on_dispatch("a", "r2", 3_000, now=0.0)
    assert abs(q.delay("a", 0.0) - 0.108) < 1e-12
    assert q.delay("b", 0.0) == 0.0
    q.on_prefilled("a", "r1", now=0.004)  # seen 4 ms earlier than predicted
    assert abs(q.delay("a", 0.004) - 0.1) < 1e-12


def test_traffics_reads_every_node_as_traffic_does() -> None:
    # the one-pass read a new prefix's placement uses: the same floats as node by node,
    # 0.0 for a node with no traffic yet
    q = PrefillQueue(PrefillModel(tokens_per_s=30_000.0, step_s=0.008), traffic_window_s=60.0)
    for i, (node, t) in enumerate([("a", 0.0), ("a", 1.5), ("b", 7.25), ("a", 9.0), ("c", 30.0)]):
        q.on_dispatch(node, f"r{i}", 100, now=t)
    nodes = ["c", "a", "idle", "b"]
    for now in (30.0, 41.7, 95.3):
        got = q.traffics(nodes, now)
        assert list(got) == nodes
        assert got == {n: q.traffic(n, now) for n in nodes}
        assert got["idle"] == 0.0 and got["a"] > got["b"] > 0.0


def test_backlogged_matches_a_scan_of_every_node() -> None:
    # the kept set of nodes that may be busy against a plain scan, over random dispatches,
    # prefills, reports and removals, with time mostly moving forward and sometimes back
    import random

    for seed in range(30):
        rng = random.Random(seed)
        q = PrefillQueue(PrefillModel(tokens_per_s=20_000.0, step_s=0.01))
        nodes = [f"n{i}" for i in range(6)]
        pending: dict[str, list[str]] = {n: [] for n in nodes}
        now = 0.0
        for i in range(300):
            if rng.random() < 0.1:
                now = max(0.0, now - rng.uniform(0, 0.2))  # a clock that went back
            else:
                now += rng.choice([0.0, 0.001, 0.02, 0.3])
            node = rng.choice(nodes)
            op = rng.random()
            if op < 0.45:
                rid = f"r{i}"
                q.on_dispatch(node, rid, rng.choice([0, 100, 4_000]), now)
                pending[node].append(rid)
            elif op < 0.7 and pending[node]:
                q.on_prefilled(node, pending[node].pop(rng.randrange(len(pending[node]))), now)
            elif op < 0.9:
                q.on_report(node, now, idle=rng.random() < 0.5)
            elif op < 0.95:
                q.forget(node)
                pending[node] = []
            at = now + rng.choice([0.0, 0.0, 0.005, -0.05])
            want = {n: u - at for n, u in q._busy_until.items() if u > at}
            assert q.backlogged(at) == want, (seed, i)
