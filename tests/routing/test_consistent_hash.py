from __future__ import annotations

import pytest

from kvgate.routing.consistent_hash import HashRing

KEYS = [f"model:key{i}" for i in range(2000)]


def test_walk_lists_each_node_once() -> None:
    ring = HashRing([f"n{i}" for i in range(5)], virtual_nodes=50)
    walk = ring.walk("model:abc")
    assert sorted(walk) == [f"n{i}" for i in range(5)]
    assert ring.home_set("model:abc", 2) == list(walk[:2])
    assert ring.home_set("model:abc", 2, allowed=[walk[0], walk[2]]) == [walk[0], walk[2]]


def test_keys_spread_over_nodes() -> None:
    ring = HashRing([f"n{i}" for i in range(4)], virtual_nodes=100)
    owners = [ring.home_set(k, 1)[0] for k in KEYS]
    for i in range(4):
        assert 0.15 < owners.count(f"n{i}") / len(KEYS) < 0.35


def test_adding_a_node_moves_only_its_share() -> None:
    ring = HashRing([f"n{i}" for i in range(4)], virtual_nodes=100)
    before = {k: ring.home_set(k, 1)[0] for k in KEYS}
    ring.add_node("n4")
    after = {k: ring.home_set(k, 1)[0] for k in KEYS}
    moved = [k for k in KEYS if before[k] != after[k]]
    assert all(after[k] == "n4" for k in moved)  # keys only move to the new node
    assert 0.1 < len(moved) / len(KEYS) < 0.3  # about 1/5 of them


def test_removing_a_node_moves_only_its_keys() -> None:
    ring = HashRing([f"n{i}" for i in range(5)], virtual_nodes=100)
    before = {k: ring.home_set(k, 1)[0] for k in KEYS}
    ring.remove_node("n2")
    after = {k: ring.home_set(k, 1)[0] for k in KEYS}
    for k in KEYS:
        if before[k] != "n2":
            assert after[k] == before[k]
        else:
            assert after[k] != "n2"


def test_bounded_load_skips_overloaded_node() -> None:
    ring = HashRing([f"n{i}" for i in range(4)], virtual_nodes=100, load_factor=1.25)
    key = "model:hot"
    first, second = ring.walk(key)[:2]
    loads = {n: 0.0 for n in ring.nodes}
    assert ring.home_set(key, 1, loads) == [first]
    loads[first] = 10.0  # capacity = 1.25 * 11 / 4 ≈ 3.4
    assert ring.home_set(key, 1, loads) == [second]
    assert first not in ring.home_set(key, 2, loads)


def test_bounded_load_keeps_every_node_under_c_times_average() -> None:
    ring = HashRing([f"n{i}" for i in range(4)], virtual_nodes=100, load_factor=1.25)
    loads = {n: 0.0 for n in ring.nodes}
    for _i in range(400):
        node = ring.home_set("model:single-hot-key", 1, loads)[0]
        loads[node] += 1
        assert max(loads.values()) <= 1.25 * sum(loads.values()) / 4 + 1


def test_invalid_parameters() -> None:
    with pytest.raises(ValueError, match="load_factor"):
        HashRing(load_factor=1.0)
    with pytest.raises(ValueError, match="virtual_nodes"):
        HashRing(virtual_nodes=0)


def test_partial_walks_agree_with_the_whole_walk() -> None:
    ring = HashRing([f"n{i}" for i in range(40)], virtual_nodes=20)
    for i, key in enumerate(KEYS[:200]):
        first = ring.home_set(key, 1 + i % 3)  # follows the walk only this far
        walk = ring.walk(key)  # then completes it
        assert first == list(walk[: 1 + i % 3])
        assert sorted(walk) == sorted(ring.nodes)
    loads = {n: float(i % 7) for i, n in enumerate(sorted(ring.nodes))}
    fresh = HashRing([f"n{i}" for i in range(40)], virtual_nodes=20)
    for key in KEYS[:200]:
        walk = fresh.walk(key)
        total = sum(loads[n] for n in walk)
        bound = 1.25 * (total + 1.0) / len(walk)
        expected = [n for n in walk if loads[n] + 1.0 <= -(-bound // 1)][:2]
        assert ring.home_set(key, 2, loads, loads) == expected
