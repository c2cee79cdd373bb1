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


class _PlainPool:
    """The pool as specified, one plain list for the free queue (next to reuse first):
    a freed block holding no cached content goes to the front, a cached one to the back,
    a touched one leaves its place; allocating takes from the front, evicting hashes."""

    def __init__(self, n: int) -> None:
        self.order = list(range(n))
        self.ref_cnt = [0] * n
        self.block_hash: list[int | None] = [None] * n
        self.cached: dict[int, int] = {}
        self.evictions = 0

    def allocate(self, n: int) -> list[int]:
        out = self.order[:n]
        del self.order[:n]
        for b in out:
            h = self.block_hash[b]
            if h is not None:
                self.block_hash[b] = None
                if self.cached.get(h) == b:
                    del self.cached[h]
                self.evictions += 1
            self.ref_cnt[b] = 1
        return out

    def touch(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.ref_cnt[b] == 0:
                self.order.remove(b)
            self.ref_cnt[b] += 1

    def free(self, blocks: list[int]) -> None:
        for b in reversed(blocks):
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                if self.block_hash[b] is None:
                    self.order.insert(0, b)
                else:
                    self.order.append(b)

    def cache_block(self, b: int, h: int) -> None:
        if self.block_hash[b] is None and h not in self.cached:
            self.block_hash[b] = h
            self.cached[h] = b

    def reset_prefix_cache(self) -> int:
        dropped = 0
        for b in self.order:
            h = self.block_hash[b]
            if h is not None and self.ref_cnt[b] == 0:
                self.block_hash[b] = None
                if self.cached.get(h) == b:
                    del self.cached[h]
                dropped += 1
        return dropped


@pytest.mark.parametrize("seed", range(40))
def test_free_queue_runs_keep_the_plain_eviction_order(seed: int) -> None:
    # the pool queues a freed request's cached blocks as one run and leaves blocks taken
    # back out of it as dead entries; prefixes reused whole or in part, shared by running
    # requests, evicted, reset and touched while uncached must leave every block, hash and
    # count where the plain free queue has them
    import random

    rng = random.Random(seed)
    n = rng.choice([16, 40, 120])
    pool, plain = BlockPool(n), _PlainPool(n)
    heads = [[1000 * g + i for i in range(rng.randint(2, 12))] for g in range(rng.randint(2, 6))]
    running: list[list[int]] = []
    for step in range(400):
        op = rng.random()
        if op < 0.5:
            head = rng.choice(heads)
            chain = head[: rng.randint(1, len(head))] + [10**6 + step * 10 + i for i in range(3)]
            cached = pool.lookup(chain)
            assert cached == _plain_lookup(pool, chain)
            if cached and rng.random() < 0.4:
                cached = cached[: rng.randrange(len(cached) + 1)]  # a shorter reuse
            need = rng.randint(0, 4) + len(chain) - len(cached)
            taking = list(map(plain.ref_cnt.__getitem__, cached)).count(0)
            assert pool.count_free(cached) == taking
            if need > pool.num_free - taking:
                continue
            pool.touch(cached)
            plain.touch(cached)
            new = pool.allocate(need)
            assert new == plain.allocate(need)
            table = cached + new
            for i in range(len(cached), min(len(chain), len(table))):
                if rng.random() < 0.9:
                    pool.cache_block(table[i], chain[i])
                    plain.cache_block(table[i], chain[i])
            running.append(table)
        elif op < 0.85 and running:
            table = running.pop(rng.randrange(len(running)))
            pool.free(table)
            plain.free(table)
        elif op < 0.9:
            assert pool.reset_prefix_cache() == plain.reset_prefix_cache()
        elif op < 0.93:
            # touch a free block holding nothing cached (not an engine path, kept exact)
            blank = [b for b in plain.order if plain.block_hash[b] is None]
            if blank:
                b = rng.choice(blank)
                pool.touch([b])
                plain.touch([b])
                running.append([b])
        elif op < 0.97:
            # any free cached blocks, in any order (the engine only takes leading runs)
            free_cached = [b for b in plain.order if plain.block_hash[b] is not None]
            some = rng.sample(free_cached, rng.randint(0, len(free_cached)))
            pool.touch(some)
            plain.touch(some)
            running.append(some)
        elif running:
            # a running request's blocks touched again by another (shared, no queue change)
            table = rng.choice(running)
            pool.touch(table)
            plain.touch(table)
            running.append(list(table))
        assert pool.eviction_order() == plain.order
        assert pool.num_free == len(plain.order)
        assert pool.ref_cnt == plain.ref_cnt
        assert pool.block_hash == plain.block_hash
        assert pool.cached == plain.cached
        assert pool.evictions == plain.evictions
        # dead entries stay bounded: past the front run, at most one per live entry
        for run in list(pool._runs.values())[1:]:
            assert len(run.blocks) - run.pos <= 2 * run.live
