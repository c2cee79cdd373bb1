from __future__ import annotations

from kvgate.routing.prefix_index import PrefixIndex, RouteKeyCache
from kvgate.tokens import block_hashes


def chain(prefix: str, n_blocks: int) -> list[int]:
    return block_hashes([f" {prefix}{i}" for i in range(n_blocks * 16)])


def test_match_gives_longest_leading_run_per_node() -> None:
    index = PrefixIndex(ttl_s=100)
    shared = chain("a", 10)
    index.record("n1", shared[:4], now=0)
    index.record("n2", shared, now=0)
    index.record("n3", chain("b", 10), now=0)
    assert index.match(shared, now=1) == {"n1": 4, "n2": 10}
    assert index.match(shared[:6], now=1) == {"n1": 4, "n2": 6}
    assert index.match(chain("c", 3), now=1) == {}
    assert index.match(shared, now=1, nodes=["n1"]) == {"n1": 4}
    assert index.match([], now=1) == {}


def test_divergent_chains_match_only_the_shared_head() -> None:
    index = PrefixIndex()
    pieces = [f" p{i}" for i in range(64)]
    a = block_hashes(pieces + [f" x{i}" for i in range(32)])
    b = block_hashes(pieces + [f" y{i}" for i in range(32)])
    index.record("n1", a, now=0)
    assert index.match(b, now=0) == {"n1": 4}


def test_entries_expire_after_ttl() -> None:
    index = PrefixIndex(ttl_s=120)
    hashes = chain("a", 5)
    index.record("n1", hashes, now=0)
    assert index.match(hashes, now=119) == {"n1": 5}
    assert index.match(hashes, now=121) == {}
    index.record("n2", chain("b", 2), now=200)  # recording sweeps expired blocks
    assert len(index) == 2
    assert index.stats().expirations == 5


def test_refresh_extends_ttl_for_one_node_only() -> None:
    index = PrefixIndex(ttl_s=10)
    hashes = chain("a", 3)
    index.record("n1", hashes, now=0)
    index.record("n2", hashes, now=8)
    assert index.match(hashes, now=12) == {"n2": 3}


def test_memory_is_bounded_under_unique_prompts() -> None:
    index = PrefixIndex(ttl_s=1e9, max_entries=500)
    for i in range(300):
        index.record(f"n{i % 4}", chain(f"u{i}-", 8), now=float(i))
        assert len(index) <= 500
    assert index.stats().evictions == 300 * 8 - len(index)
    recent = chain("u299-", 8)
    assert index.match(recent, now=300) == {"n3": 8}
    assert index.match(chain("u0-", 8), now=300) == {}


def test_eviction_removes_chain_tails_first() -> None:
    index = PrefixIndex(ttl_s=1e9, max_entries=10)
    old = chain("old", 8)
    index.record("n1", old, now=0)
    index.record("n1", chain("new", 4), now=1)  # 12 entries: two of the old chain go
    assert index.match(old, now=2) == {"n1": 6}


def test_drop_and_purge() -> None:
    index = PrefixIndex()
    hashes = chain("a", 4)
    index.record("n1", hashes, now=0)
    index.record("n2", hashes, now=0)
    assert index.drop("n1", hashes) == 4
    assert index.match(hashes, now=0) == {"n2": 4}
    index.record("n1", chain("b", 3), now=0)
    assert index.purge_node("n2") == 4
    assert index.match(hashes, now=0) == {}
    assert len(index) == 3


def test_route_key_cache_is_lru() -> None:
    cache = RouteKeyCache(max_size=2)
    cache.put("a", ("n1",))
    cache.put("b", ("n2",))
    assert cache.get("a") == ("n1",)
    cache.put("c", ("n3",))
    assert cache.get("b") is None
    assert cache.get("a") == ("n1",) and len(cache) == 2


def test_entry_count_stays_exact_with_shared_blocks() -> None:
    index = PrefixIndex(ttl_s=50, max_entries=40)
    for i in range(30):
        hashes = chain(f"s{i % 6}-", 5)
        index.record(f"n{i % 4}", hashes, now=float(i))
        index.record(f"n{(i + 1) % 4}", hashes[:3], now=float(i))
        total = sum(len(index.match(hashes, now=float(i))) for _ in [0])
        assert total >= 1
        assert len(index) <= 40
        assert len(index) == sum(
            1 if isinstance(v, tuple) else len(v)
            for v in index.block_table().values()  # the bookkeeping matches the contents
        )
    index.expire(now=1000)
    assert len(index) == 0 and index.stats().blocks == 0


class _PlainIndex:
    """What ``PrefixIndex.record`` must do, written plainly: touch deepest-first, set this
    node's time. ``record`` applies a call to both and checks they agree."""

    def __init__(self) -> None:
        self.index = PrefixIndex(ttl_s=1e9, max_entries=10**6)
        self.blocks: dict[int, dict[str, float]] = {}
        self.order: list[int] = []  # least recently touched first

    def record(self, node: str, hashes: list[int], now: float) -> None:
        self.index.record(node, hashes, now=now)
        for h in reversed(hashes):
            self.blocks.setdefault(h, {})[node] = now
            if h in self.order:
                self.order.remove(h)
            self.order.append(h)
        table = self.index.block_table()
        assert list(table) == self.order
        for h, holders in table.items():
            got = {holders[0]: holders[1]} if isinstance(holders, tuple) else dict(holders)
            assert got == self.blocks[h] and list(got) == list(self.blocks[h])  # holder order too
        assert len(self.index) == sum(len(v) for v in self.blocks.values())


def test_record_matches_plain_model_in_holders_and_lru_order() -> None:
    # the fast path (every block already this node's alone) and the general loop must
    # leave the same holders, times and LRU order as the plain model
    import random

    rng = random.Random(3)
    plain = _PlainIndex()
    prompts = [chain(f"p{i}-", 6) for i in range(4)] + [chain("p0-", 3)]
    head = [f" h{i}" for i in range(4 * 16)]
    for step in range(300):
        node, hashes = rng.choice(["n1", "n1", "n1", "n2"]), rng.choice(prompts)
        if step % 3 == 0:  # a shared head and a question of its own: new deepest blocks
            hashes = block_hashes(head + [f" q{step}-{j}" for j in range(rng.randint(1, 40))])
        plain.record(node, hashes, float(step))


def test_record_on_shared_blocks_matches_plain_model() -> None:
    # a prefix spread over several nodes (every block a shared holder), mixed with
    # single holders and new blocks
    import random

    rng = random.Random(5)
    plain = _PlainIndex()
    prompts = [chain(f"s{i}-", 8) for i in range(3)] + [chain("s0-", 4)]
    for step in range(400):
        plain.record(f"n{rng.randrange(4)}", rng.choice(prompts), float(step))
