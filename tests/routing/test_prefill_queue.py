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
