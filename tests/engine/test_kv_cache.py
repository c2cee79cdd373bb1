"""Block pool and KV cache manager: refcounts, prefix reuse, LRU eviction."""

from __future__ import annotations

import pytest

from kvgate.engine.kv_cache import BlockPool, KVCacheManager


def test_allocate_and_free_track_refcounts() -> None:
    pool = BlockPool(4)
    blocks = pool.allocate(3)
    assert pool.num_free == 1
    assert all(pool.ref_cnt[b] == 1 for b in blocks)
    pool.touch(blocks[:1])
    assert pool.ref_cnt[blocks[0]] == 2
    pool.free(blocks)
    assert pool.ref_cnt[blocks[0]] == 1 and pool.num_free == 3
    pool.free(blocks[:1])
    assert pool.num_free == 4
    with pytest.raises(RuntimeError):
        pool.allocate(5)


def test_freed_blocks_stay_cached_until_reused() -> None:
    kv = KVCacheManager(4, 16)
    assert kv.allocate("a", 32)
    kv.cache_full_blocks("a", [11, 12], 32)
    kv.free("a")
    assert kv.pool.num_free == 4
    # Still findable after free: prefix caching across requests.
    assert len(kv.pool.lookup([11, 12, 13])) == 2
    # A prompt entirely cached recomputes its last block (last token always computed).
    assert len(kv.cached_prefix_blocks([11, 12], 32)) == 1
    assert len(kv.cached_prefix_blocks([11, 12], 40)) == 2


def test_lru_eviction_order_oldest_prefix_first() -> None:
    kv = KVCacheManager(4, 16)
    for rid, h in (("a", 1), ("b", 2), ("c", 3)):
        assert kv.allocate(rid, 16)
        kv.cache_full_blocks(rid, [h], 16)
        kv.free(rid)
    # Needing two fresh blocks: the uncached block goes first, then the oldest (a's).
    assert kv.allocate("d", 32)
    assert kv.pool.lookup([1]) == []
    assert len(kv.pool.lookup([2])) == 1 and len(kv.pool.lookup([3])) == 1
    assert kv.pool.evictions == 1
    # Touching b's block makes it recently used: c is evicted next.
    assert kv.allocate("e", 32, kv.pool.lookup([2]))
    kv.free("e")
    kv.free("d")
    assert kv.allocate("f", 48)
    assert kv.pool.lookup([3]) == []


def test_tail_blocks_are_evicted_before_the_shared_head() -> None:
    kv = KVCacheManager(3, 16)
    assert kv.allocate("a", 48)
    kv.cache_full_blocks("a", [1, 2, 3], 48)
    kv.free("a")
    assert kv.allocate("b", 16)  # evicts one block: the tail (hash 3)
    assert len(kv.pool.lookup([1, 2, 3])) == 2


def test_shared_prefix_blocks_are_refcounted() -> None:
    kv = KVCacheManager(4, 16)
    assert kv.allocate("a", 20)
    kv.cache_full_blocks("a", [7], 20)
    shared = kv.cached_prefix_blocks([7], 40)
    assert shared == kv.tables["a"][:1]
    assert kv.allocate("b", 40, shared)
    assert kv.pool.ref_cnt[shared[0]] == 2
    assert kv.pool.num_free == 0  # a: 2 blocks, b: shared + 2 new
    kv.free("a")
    assert kv.pool.ref_cnt[shared[0]] == 1
    assert not kv.allocate("c", 48)  # only a's private block is free


def test_can_allocate_counts_free_cached_blocks_it_would_take() -> None:
    kv = KVCacheManager(2, 16)
    assert kv.allocate("a", 16)
    kv.cache_full_blocks("a", [5], 16)
    kv.free("a")
    cached = kv.pool.lookup([5])
    # 2 free blocks, one of them the cached block it reuses: 48 tokens need 3.
    assert not kv.can_allocate("b", 48, cached)
    assert kv.can_allocate("b", 32, cached)


def test_reset_prefix_cache_drops_only_free_blocks() -> None:
    kv = KVCacheManager(4, 16)
    assert kv.allocate("a", 16)
    kv.cache_full_blocks("a", [1], 16)
    assert kv.allocate("b", 16)
    kv.cache_full_blocks("b", [2], 16)
    kv.free("a")
    assert kv.pool.reset_prefix_cache() == 1
    assert kv.pool.lookup([1]) == [] and len(kv.pool.lookup([2])) == 1


def _plain_lookup(pool: BlockPool, hashes: list[int]) -> list[int]:
    out = []
    for h in hashes:
        if h not in pool.cached:
            break
        out.append(pool.cached[h])
    return out


@pytest.mark.parametrize("seed", range(10))
def test_lookup_answers_as_a_plain_probe_of_the_cache_map(seed: int) -> None:
    # lookup remembers runs it found; requests, evictions and resets in between must never
    # make it answer differently from probing the map block by block
    import random

    rng = random.Random(seed)
    kv = KVCacheManager(rng.choice([12, 30]), 4)
    heads = [[100 * g + i for i in range(rng.randint(1, 6))] for g in range(4)]
    running: list[str] = []
    for step in range(300):
        head = rng.choice(heads)
        chain = head[: rng.randint(1, len(head))] + [10_000 + step * 10 + i for i in range(2)]
        op = rng.random()
        if op < 0.5:
            rid = f"r{step}"
            cached = kv.cached_prefix_blocks(chain, len(chain) * 4)
            assert kv.pool.lookup(chain) == _plain_lookup(kv.pool, chain)
            if kv.allocate(rid, len(chain) * 4, cached):
                kv.cache_full_blocks(rid, chain, len(chain) * 4, len(cached))
                running.append(rid)
        elif op < 0.9 and running:
            kv.free(running.pop(rng.randrange(len(running))))
        elif op < 0.95:
            kv.pool.reset_prefix_cache()
        for probe in (chain, rng.choice(heads), chain[:1]):
            assert kv.pool.lookup(probe) == _plain_lookup(kv.pool, probe)
