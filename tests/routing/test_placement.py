from __future__ import annotations

from kvgate.routing.placement import Placements


def test_placements_count_live_keys_where_they_were_last_sent() -> None:
    p = Placements(ttl_s=100.0)
    for i in range(8):
        p.on_dispatch(f"k{i}", f"n{i % 4}", 0.0)
    assert [p.count(f"n{i}") for i in range(4)] == [2, 2, 2, 2]
    p.on_dispatch("k1", "n3", 2.0)  # a key moves: counted once, where it is now
    assert (p.count("n1"), p.count("n3")) == (1, 3)
    p.on_dispatch("late", "n2", 150.0)  # everything else expired (ttl 100 s)
    assert [p.count(f"n{i}") for i in range(4)] == [0, 0, 1, 0]
    p.forget("n2")
    assert p.count("n2") == 0


def test_counts_are_count_per_node_in_order() -> None:
    p = Placements(ttl_s=100.0)
    for i, node in enumerate(["n1", "n2", "n1", "n3", "n1"]):
        p.on_dispatch(f"k{i}", node, float(i))
    nodes = ["n3", "n0", "n1", "n2"]
    assert p.counts(nodes) == [p.count(n) for n in nodes] == [1, 0, 3, 1]
