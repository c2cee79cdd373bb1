"""Prefix index: chained block hash → nodes that recently served it.

Bounded (LRU over blocks, counting (block, node) entries) and TTL'd. ``record`` touches a
prompt's blocks deepest-first so the first block is the most recently used: LRU eviction
then removes the tail of a chain before its head, keeping "block i present ⇒ its prefix is
present" true, which lets ``match`` binary-search the chain.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_NEVER = float("-inf")


@dataclass(slots=True)
class IndexStats:
    entries: int
    blocks: int
    evictions: int
    expirations: int


class PrefixIndex:
    def __init__(self, ttl_s: float = 120.0, max_entries: int = 1_000_000) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        # block hash → {node_id: last_seen}; order = least recently touched first
        self._blocks: OrderedDict[int, dict[str, float]] = OrderedDict()
        self._touched: dict[int, float] = {}
        self._entries = 0
        self.evictions = 0
        self.expirations = 0

    def __len__(self) -> int:
        return self._entries

    def stats(self) -> IndexStats:
        return IndexStats(self._entries, len(self._blocks), self.evictions, self.expirations)

    def record(self, node_id: str, block_hashes: Sequence[int], now: float) -> None:
        blocks = self._blocks
        for h in reversed(block_hashes):
            nodes = blocks.get(h)
            if nodes is None:
                nodes = blocks[h] = {}
            else:
                blocks.move_to_end(h)
            if node_id not in nodes:
                self._entries += 1
            nodes[node_id] = now
            self._touched[h] = now
        self.expire(now)
        while self._entries > self.max_entries:
            h, nodes = blocks.popitem(last=False)
            del self._touched[h]
            self._entries -= len(nodes)
            self.evictions += len(nodes)

    def expire(self, now: float) -> int:
        """Drop blocks nobody touched within the TTL; returns entries removed."""
        cutoff = now - self.ttl_s
        removed = 0
        blocks = self._blocks
        while blocks:
            h = next(iter(blocks))
            if self._touched[h] >= cutoff:
                break
            nodes = blocks.pop(h)
            del self._touched[h]
            removed += len(nodes)
        self._entries -= removed
        self.expirations += removed
        return removed

    def match(
        self, block_hashes: Sequence[int], now: float, nodes: Iterable[str] | None = None
    ) -> dict[str, int]:
        """Per node, the number of leading blocks of ``block_hashes`` it recently served."""
        if not block_hashes:
            return {}
        cutoff = now - self.ttl_s
        first = self._blocks.get(block_hashes[0])
        if not first:
            return {}
        if nodes is None:
            alive = {n for n, t in first.items() if t >= cutoff}
        else:
            allowed = nodes if isinstance(nodes, (set, frozenset, dict)) else set(nodes)
            alive = {n for n, t in first.items() if t >= cutoff and n in allowed}
        result: dict[str, int] = {}
        last = len(block_hashes) - 1
        if alive and last > 0:
            # Fast path for full hits: nodes holding the last block hold the whole chain.
            tail = self._blocks.get(block_hashes[last])
            if tail:
                for n in [n for n in alive if tail.get(n, _NEVER) >= cutoff]:
                    result[n] = last + 1
                    alive.discard(n)
            if alive:
                self._search(block_hashes, 1, last - 1, alive, cutoff, result)
        elif alive:
            for n in alive:
                result[n] = 1
        return result

    def _search(
        self,
        hashes: Sequence[int],
        lo: int,
        hi: int,
        alive: set[str],
        cutoff: float,
        result: dict[str, int],
    ) -> None:
        """Every node in ``alive`` has blocks [0, lo); find how far each reaches in [lo, hi]."""
        if lo > hi:
            for n in alive:
                result[n] = lo
            return
        mid = (lo + hi) // 2
        entry = self._blocks.get(hashes[mid])
        present = {n for n in alive if entry.get(n, _NEVER) >= cutoff} if entry else set()
        absent = alive - present
        if present:
            self._search(hashes, mid + 1, hi, present, cutoff, result)
        if absent:
            self._search(hashes, lo, mid - 1, absent, cutoff, result)

    def drop(self, node_id: str, block_hashes: Iterable[int]) -> int:
        """Forget that ``node_id`` holds these blocks (demotion); returns entries removed."""
        removed = 0
        for h in block_hashes:
            nodes = self._blocks.get(h)
            if nodes and nodes.pop(node_id, None) is not None:
                removed += 1
                if not nodes:
                    del self._blocks[h]
                    del self._touched[h]
        self._entries -= removed
        return removed

    def purge_node(self, node_id: str) -> int:
        """Forget everything about a node (restart, removal); returns entries removed."""
        removed = 0
        empty: list[int] = []
        for h, nodes in self._blocks.items():
            if nodes.pop(node_id, None) is not None:
                removed += 1
                if not nodes:
                    empty.append(h)
        for h in empty:
            del self._blocks[h]
            del self._touched[h]
        self._entries -= removed
        return removed


class RouteKeyCache:
    """Small LRU of route key → value (the ring walk order of a route key)."""

    def __init__(self, max_size: int = 4096) -> None:
        self.max_size = max_size
        self._items: OrderedDict[str, tuple[str, ...]] = OrderedDict()

    def get(self, key: str) -> tuple[str, ...] | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: str, value: tuple[str, ...]) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.max_size:
            self._items.popitem(last=False)

    def clear(self) -> None:
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)
