"""Prefix index: chained block hash → nodes that recently served it.

Bounded (LRU over blocks, counting (block, node) entries) and TTL'd. ``record`` touches a
prompt's blocks deepest-first so the first block is the most recently used: LRU eviction
then removes the tail of a chain before its head, keeping "block i present ⇒ its prefix is
present" true, which lets ``match`` binary-search the chain.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Generic, TypeVar

V = TypeVar("V")
_NEVER = float("-inf")
_first = itemgetter(0)

# Most blocks are held by one node: they are stored as a (node_id, last_seen) tuple
# (≈ 130 B less than a one-key dict); a block seen on several nodes becomes a dict.
Holders = tuple[str, float] | dict[str, float]


def _seen(holders: Holders, node_id: str) -> float:
    if type(holders) is tuple:
        return holders[1] if holders[0] == node_id else _NEVER
    return holders.get(node_id, _NEVER)  # type: ignore[union-attr]


def _single_holder(current: list[Holders], node_id: str) -> bool:
    """Every one of these holders is this node alone."""
    try:
        return set(map(_first, current)) == {node_id}
    except (KeyError, TypeError):  # a shared (dict) holder
        return False


def _count(holders: Holders) -> int:
    return 1 if type(holders) is tuple else len(holders)


def _newest(holders: Holders) -> float:
    if type(holders) is tuple:
        return holders[1]
    return max(holders.values())  # type: ignore[union-attr]


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
        # block hash → holders; order = least recently touched first
        self._blocks: OrderedDict[int, Holders] = OrderedDict()
        self._entries = 0
        self.evictions = 0
        self.expirations = 0

    def __len__(self) -> int:
        return self._entries

    def stats(self) -> IndexStats:
        return IndexStats(self._entries, len(self._blocks), self.evictions, self.expirations)

    def record(self, node_id: str, block_hashes: Sequence[int], now: float) -> None:
        blocks = self._blocks
        order = block_hashes[::-1]  # touched deepest-first
        held = (node_id, now)
        # A prompt's own deepest blocks are often new (a shared head + a new question).
        k, n = 0, len(order)
        while k < n and order[k] not in blocks:
            blocks[order[k]] = held
            k += 1
        added = k
        rest = order[k:] if k else order
        # The usual remainder (a hit, or the completion of a dispatch recorded moments
        # ago): every block held by this node alone. Same result as the general loop,
        # with the per-block work done by C-level maps.
        try:
            current = list(map(blocks.__getitem__, rest))
        except KeyError:  # a block not held yet
            current = None
        if current is not None and _single_holder(current, node_id):
            deque(map(blocks.move_to_end, rest), maxlen=0)
            for h in rest:
                blocks[h] = held
        else:
            added += self._touch(node_id, rest, now)
        self._entries += added
        self.expire(now)
        while self._entries > self.max_entries:
            _, holders = blocks.popitem(last=False)
            count = _count(holders)
            self._entries -= count
            self.evictions += count

    def _touch(self, node_id: str, order: Sequence[int], now: float) -> int:
        """The general case, block by block in ``order``; returns entries added."""
        blocks = self._blocks
        held = (node_id, now)  # one shared tuple: tuples are never mutated
        added = 0
        for h in order:
            holders = blocks.get(h)
            if holders is None:
                blocks[h] = held
                added += 1
                continue
            if type(holders) is tuple:
                if holders[0] == node_id:
                    blocks[h] = held
                else:
                    blocks[h] = {holders[0]: holders[1], node_id: now}
                    added += 1
            else:
                if node_id not in holders:
                    added += 1
                holders[node_id] = now  # type: ignore[index]
            blocks.move_to_end(h)
        return added

    def expire(self, now: float) -> int:
        """Drop blocks nobody touched within the TTL; returns entries removed."""
        cutoff = now - self.ttl_s
        removed = 0
        blocks = self._blocks
        while blocks:
            h = next(iter(blocks))
            # the front block is the least recently touched; its newest time is its touch
            if _newest(blocks[h]) >= cutoff:
                break
            removed += _count(blocks.pop(h))
        self._entries -= removed
        self.expirations += removed
        return removed

    def match(
        self,
        block_hashes: Sequence[int],
        now: float,
        nodes: Iterable[str] | None = None,
        max_age_s: float | None = None,
    ) -> dict[str, int]:
        """Per node, the number of leading blocks of ``block_hashes`` it recently served
        (within ``max_age_s`` when given, else the index's TTL)."""
        if not block_hashes:
            return {}
        cutoff = now - (self.ttl_s if max_age_s is None else min(max_age_s, self.ttl_s))
        blocks = self._blocks
        first = blocks.get(block_hashes[0])
        if first is None:
            return {}
        pairs = [first] if type(first) is tuple else first.items()  # type: ignore[union-attr]
        if nodes is None:
            alive = [n for n, t in pairs if t >= cutoff]
        else:
            allowed = nodes if isinstance(nodes, (set, frozenset, dict)) else set(nodes)
            alive = [n for n, t in pairs if t >= cutoff and n in allowed]
        result: dict[str, int] = {}
        n_blocks = len(block_hashes)
        tail = blocks.get(block_hashes[-1]) if n_blocks > 1 else None
        for node in alive:
            # Fast path for full hits: a node holding the last block holds the whole chain.
            if tail is not None and _seen(tail, node) >= cutoff:
                result[node] = n_blocks
                continue
            # Binary search; invariant: blocks [0, lo) are on the node, block hi is not
            # (or hi is the end of the chain).
            lo, hi = 1, (n_blocks - 1 if tail is not None else n_blocks)
            while lo < hi:
                mid = (lo + hi) // 2
                holders = blocks.get(block_hashes[mid])
                if holders is None:
                    hi = mid
                    continue
                if type(holders) is tuple:  # inlined _seen: this loop is the hot path
                    seen = holders[1] if holders[0] == node else _NEVER
                else:
                    seen = holders.get(node, _NEVER)  # type: ignore[union-attr]
                if seen >= cutoff:
                    lo = mid + 1
                else:
                    hi = mid
            result[node] = lo
        return result

    def _remove(self, h: int, holders: Holders, node_id: str) -> bool:
        """Remove one node from a block's holders; True when it was there."""
        if type(holders) is tuple:
            if holders[0] != node_id:
                return False
            del self._blocks[h]
            return True
        if holders.pop(node_id, None) is None:  # type: ignore[union-attr]
            return False
        if len(holders) == 1:
            ((other, seen),) = holders.items()  # type: ignore[union-attr]
            self._blocks[h] = (other, seen)
        elif not holders:
            del self._blocks[h]
        return True

    def drop(self, node_id: str, block_hashes: Iterable[int]) -> int:
        """Forget that ``node_id`` holds these blocks (demotion); returns entries removed."""
        removed = 0
        for h in block_hashes:
            holders = self._blocks.get(h)
            if holders is not None and self._remove(h, holders, node_id):
                removed += 1
        self._entries -= removed
        return removed

    def purge_node(self, node_id: str) -> int:
        """Forget everything about a node (restart, removal); returns entries removed.

        A scan of the whole index (≈ 85 ms per million entries): it runs on restarts and
        removals only.
        """
        held = [
            (h, holders)
            for h, holders in self._blocks.items()
            if (holders[0] == node_id if type(holders) is tuple else node_id in holders)
        ]
        for h, holders in held:
            self._remove(h, holders, node_id)
        self._entries -= len(held)
        return len(held)


class RouteKeyCache(Generic[V]):
    """Small LRU of route key → value (the ring walk of a route key)."""

    def __init__(self, max_size: int = 4096) -> None:
        self.max_size = max_size
        self._items: OrderedDict[str, V] = OrderedDict()

    def get(self, key: str) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: str, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.max_size:
            self._items.popitem(last=False)

    def clear(self) -> None:
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)
