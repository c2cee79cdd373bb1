"""Hybrid's eviction guess: a per-node LRU shadow of the blocks sent there, kept to the
node's KV capacity, drops index matches on blocks the engine must have evicted."""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable

from kvgate.routing.policies.hybrid import ShadowLRU

from .conftest import Cluster, group_request

Factory = Callable[..., Cluster]


def test_shadow_keeps_the_most_recent_blocks_prefix_last() -> None:
    lru = ShadowLRU()
    assert lru.held("n", [1, 2]) is None  # nothing recorded: no guess
    lru.record("n", [1, 2, 3], capacity_blocks=4)
    assert lru.held("n", [1, 2, 3]) == 3
    lru.record("n", [7, 8], capacity_blocks=4)
    # one block had to go: the first request's tail, not its prefix
    assert lru.held("n", [1, 2, 3]) == 2
    lru.record("n", [1, 2], capacity_blocks=4)  # a hit refreshes the prefix
    lru.record("n", [9], capacity_blocks=4)
    # the oldest block now is the second request's tail
    assert lru.held("n", [1, 2]) == 2 and lru.held("n", [7, 8]) == 1


def test_match_on_an_evicted_prefix_is_dropped(cluster_factory: Factory) -> None:
    # 40 blocks of KV per node: a group's request (32 shared + 3 own blocks) fits, two
    # groups do not
    c = cluster_factory(n=2)
    c.report_all(kv_capacity_tokens=40 * 16)
    first = c.serve(group_request(1, "a"))
    # group 2's 35 blocks on the same node push out group 1's last 29 (its own tail
    # first, then its prefix from the end): 6 leading blocks are left
    c.serve(group_request(2, "b"), exclude=tuple(n for n in ("n0", "n1") if n != first))
    again = c.router.route(group_request(1, "c"))
    assert (again.node_id, again.expected_cached_tokens) == (first, 6 * 16), again
    # (that request was sent there: group 1 is the most recent again) two more groups on
    # that node: all of group 1 is gone, the next request of it is a new prefix
    for group, rid in ((3, "e"), (4, "g")):
        c.serve(group_request(group, rid), exclude=tuple(n for n in ("n0", "n1") if n != first))
    gone = c.router.route(group_request(1, "f"))
    assert (gone.reason, gone.expected_cached_tokens) == ("evicted_miss", 0), gone
    # with the guess off, the index's match stands
    c.flags = c.router.flags = type(c.flags)({"eviction_guess": False})
    trusted = c.router.route(group_request(1, "d"))
    assert (trusted.node_id, trusted.expected_cached_tokens) == (first, 512), trusted


class PlainShadow:
    """The eviction guess's meaning, one LRU entry per block: a record touches the chain
    deepest first and evicts the least recently touched blocks beyond the capacity."""

    def __init__(self) -> None:
        self.blocks: OrderedDict[int, None] = OrderedDict()

    def record(self, hashes: list[int], capacity_blocks: int) -> None:
        for h in reversed(hashes):
            self.blocks[h] = None
            self.blocks.move_to_end(h)
        while len(self.blocks) > capacity_blocks:
            self.blocks.popitem(last=False)

    def held(self, hashes: list[int], upto: int) -> int:
        count = 0
        for h in hashes[:upto]:
            if h not in self.blocks:
                break
            count += 1
        return count


def test_shadow_answers_as_a_per_block_lru() -> None:
    """Chains that share heads and branch, capacities that change between records:
    every held() answer is the plain per-block LRU's."""
    rng = random.Random(3)
    lru, plain = ShadowLRU(), PlainShadow()
    for step in range(3000):
        g = rng.randrange(8)
        # block i of group g identifies its prefix; group g's chains branch after a head
        # of g * 5 blocks into one of three tails
        head = [g * 1000 + i for i in range(g * 5)]
        tail = rng.randrange(3)
        chain = head + [g * 1000 + 500 + tail * 100 + i for i in range(rng.randrange(1, 30))]
        chain = chain[: rng.randrange(1, len(chain) + 1)]
        capacity = rng.choice((40, 80, 120)) if step % 100 == 0 else 80
        lru.record("n", chain, capacity_blocks=capacity)
        plain.record(chain, capacity)
        probe_group = rng.randrange(8)
        probe = [probe_group * 1000 + i for i in range(probe_group * 5)]
        probe_tail = probe_group * 1000 + 500 + rng.randrange(3) * 100
        probe += [probe_tail + i for i in range(30)]
        upto = rng.randrange(1, len(probe) + 1)
        assert lru.held("n", probe, upto) == plain.held(probe, upto), step
