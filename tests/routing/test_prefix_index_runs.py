"""The run-based prefix index against a plain one-entry-per-block model.

``PlainIndex`` is what the index's answers are defined by, written per block: an
ordered map of block hash → {node: last seen}, touched deepest-first, evicted and expired
from the front, matched by the same fast path and binary search. Random operations over
a tree of chains (shared heads, branches, multi-turn extensions, prefixes) are applied
to both; after each one the per-block table (blocks, LRU order, holders, holder order,
times), the counters and a set of matches must be the same.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Iterable, Sequence

import pytest

from kvgate.routing.prefix_index import PrefixIndex
from kvgate.tokens import block_hashes


class PlainIndex:
    def __init__(self, ttl_s: float, max_entries: int) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.blocks: OrderedDict[int, dict[str, float]] = OrderedDict()
        self.entries = 0
        self.evictions = 0
        self.expirations = 0

    def record(self, node: str, hashes: Sequence[int], now: float) -> None:
        for h in reversed(hashes):
            holders = self.blocks.setdefault(h, {})
            if node not in holders:
                self.entries += 1
            holders[node] = now
            self.blocks.move_to_end(h)
        self.expire(now)
        while self.entries > self.max_entries:
            _, holders = self.blocks.popitem(last=False)
            self.entries -= len(holders)
            self.evictions += len(holders)

    def expire(self, now: float) -> int:
        removed = 0
        while self.blocks:
            h = next(iter(self.blocks))
            if max(self.blocks[h].values()) >= now - self.ttl_s:
                break
            removed += len(self.blocks.pop(h))
        self.entries -= removed
        self.expirations += removed
        return removed

    def match(
        self,
        hashes: Sequence[int],
        now: float,
        nodes: Iterable[str] | None = None,
        max_age_s: float | None = None,
    ) -> dict[str, int]:
        if not hashes:
            return {}
        cutoff = now - (self.ttl_s if max_age_s is None else min(max_age_s, self.ttl_s))
        first = self.blocks.get(hashes[0])
        if first is None:
            return {}
        allowed = None if nodes is None else set(nodes)
        alive = [n for n, t in first.items() if t >= cutoff and (allowed is None or n in allowed)]
        tail = self.blocks.get(hashes[-1]) if len(hashes) > 1 else None
        result: dict[str, int] = {}
        for node in alive:
            if tail is not None and tail.get(node, -1e18) >= cutoff:
                result[node] = len(hashes)
                continue
            lo, hi = 1, (len(hashes) - 1 if tail is not None else len(hashes))
            while lo < hi:
                mid = (lo + hi) // 2
                if self.blocks.get(hashes[mid], {}).get(node, -1e18) >= cutoff:
                    lo = mid + 1
                else:
                    hi = mid
            result[node] = lo
        return result

    def drop(self, node: str, hashes: Iterable[int]) -> int:
        removed = 0
        for h in hashes:
            holders = self.blocks.get(h)
            if holders is not None and holders.pop(node, None) is not None:
                removed += 1
                if not holders:
                    del self.blocks[h]
        self.entries -= removed
        return removed

    def purge_node(self, node: str) -> int:
        held = [h for h, holders in self.blocks.items() if node in holders]
        return self.drop(node, held)


class Chains:
    """Chained block ids: a block's id is new for each (parent, content), so equal ids
    have equal prefixes, as ``tokens.block_hashes`` gives."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.ids: dict[tuple[int, int], int] = {}
        self.prompts: list[list[int]] = []

    def extend(self, base: list[int], n: int) -> list[int]:
        out = list(base)
        for _ in range(n):
            key = (out[-1] if out else 0, self.rng.randrange(3))  # few contents: branches meet
            out.append(self.ids.setdefault(key, len(self.ids) + 1))
        return out

    def new_prompt(self) -> list[int]:
        rng = self.rng
        kind = rng.random()
        if not self.prompts or kind < 0.15:
            prompt = self.extend([], rng.randint(1, 12))  # a new head
        elif kind < 0.55:  # a shared head and a question of its own
            base = rng.choice(self.prompts)
            prompt = self.extend(base[: rng.randint(1, len(base))], rng.randint(1, 5))
        elif kind < 0.75:  # the next turn of a conversation
            prompt = self.extend(rng.choice(self.prompts), rng.randint(1, 4))
        elif kind < 0.9:  # the same prompt again
            prompt = list(rng.choice(self.prompts))
        else:  # a prefix of one
            base = rng.choice(self.prompts)
            prompt = base[: rng.randint(1, len(base))]
        self.prompts.append(prompt)
        if len(self.prompts) > 60:
            self.prompts.pop(rng.randrange(len(self.prompts)))
        return prompt


def table_of(index: PrefixIndex) -> list[tuple[int, list[tuple[str, float]]]]:
    return [
        (h, [holders] if isinstance(holders, tuple) else list(holders.items()))
        for h, holders in index.block_table().items()
    ]


def plain_table(plain: PlainIndex) -> list[tuple[int, list[tuple[str, float]]]]:
    return [(h, list(holders.items())) for h, holders in plain.blocks.items()]


def check_same(index: PrefixIndex, plain: PlainIndex, chains: Chains, now: float) -> None:
    assert table_of(index) == plain_table(plain)
    stats = index.stats()
    assert (len(index), stats.blocks, stats.evictions, stats.expirations) == (
        plain.entries,
        len(plain.blocks),
        plain.evictions,
        plain.expirations,
    )
    rng = chains.rng
    for _ in range(4):
        query = chains.extend(rng.choice(chains.prompts), rng.randint(0, 2))
        query = query[: rng.randint(1, len(query))]
        nodes = None if rng.random() < 0.6 else rng.sample(["a", "b", "c", "d"], 2)
        age = None if rng.random() < 0.7 else rng.choice([1.0, 5.0, 50.0])
        got = index.match(query, now, nodes, age)
        assert list(got.items()) == list(plain.match(query, now, nodes, age).items())


@pytest.mark.parametrize("seed", range(12))
def test_runs_give_the_per_block_answers(seed: int) -> None:
    rng = random.Random(seed)
    ttl = rng.choice([6.0, 20.0, 1e9])
    cap = rng.choice([25, 60, 200, 10**6])
    index, plain = PrefixIndex(ttl, cap), PlainIndex(ttl, cap)
    chains = Chains(rng)
    now = 0.0
    for _ in range(400):
        now += rng.choice([0.0, 0.25, 1.0])
        op = rng.random()
        node = rng.choice(["a", "a", "b", "c", "d"])
        if op < 0.7 or not chains.prompts:
            prompt = chains.new_prompt()
            index.record(node, prompt, now)
            plain.record(node, prompt, now)
        elif op < 0.8:  # a failed attempt: the blocks past the expected hit
            prompt = rng.choice(chains.prompts)
            start = rng.randrange(len(prompt))
            assert index.drop(node, prompt, start) == plain.drop(node, prompt[start:])
        elif op < 0.86:  # a demotion: the whole chain, sometimes given as a stretch
            prompt = rng.choice(chains.prompts)
            if rng.random() < 0.5:
                assert index.drop(node, prompt) == plain.drop(node, prompt)
            else:
                stretch = prompt[rng.randrange(len(prompt)) :]
                assert index.drop(node, stretch) == plain.drop(node, stretch)
        elif op < 0.88:
            assert index.purge_node(node) == plain.purge_node(node)
        elif op < 0.93:
            assert index.expire(now) == plain.expire(now)
        check_same(index, plain, chains, now)


def test_a_request_touches_runs_not_blocks() -> None:
    # A shared 128-block head and a question of 8: the head is one run, each question one.
    index = PrefixIndex()
    head = [f" h{i}" for i in range(128 * 16)]
    for q in range(20):
        prompt = block_hashes(head + [f" q{q}-{i}" for i in range(8 * 16)])
        index.record(f"n{q % 3}", prompt, float(q))
    runs = index._present_runs()
    assert len(runs) == 21 and sorted(len(r.hashes) for r in runs)[-1] == 128
    assert index.stats().blocks == 128 + 20 * 8


def test_removed_runs_leave_no_garbage_cycles() -> None:
    # expired, evicted and dropped runs are freed by reference counting (the simulator
    # runs with the cyclic GC almost off)
    import gc

    gc.collect()
    gc.disable()
    try:
        index = PrefixIndex(ttl_s=12.0, max_entries=30)
        head = [f" h{i}" for i in range(3 * 16)]
        for i in range(60):
            prompt = block_hashes(head + [f" q{i}-{j}" for j in range(16 * (1 + i % 3))])
            index.record(f"n{i % 2}", prompt, float(i))
            if i % 7 == 0:
                index.drop(f"n{i % 2}", prompt, start=2)
        assert index.stats().expirations > 0 and index.stats().evictions > 0
        assert gc.collect() == 0
    finally:
        gc.enable()
