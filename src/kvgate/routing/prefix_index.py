"""Prefix index: chained block hash → nodes that recently served it.

Bounded (LRU over blocks, counting (block, node) entries) and TTL'd. ``record`` touches a
prompt's blocks deepest-first so the first block is the most recently used: LRU eviction
then removes the tail of a chain before its head, keeping "block i present ⇒ its prefix is
present" true, which lets ``match`` binary-search the chain.

The answers are those of one LRU entry per block, but the blocks are stored as *runs*:
the recorded chains form a tree (a block hash identifies its whole prefix: equal hashes
have equal parents, as ``tokens.block_hashes`` gives), and a run is a stretch of one
branch whose blocks were touched by the same ``record`` calls. Such blocks have the same
holders and times and sit together in the per-block LRU order (deepest first), so a run is
one LRU entry, and a call costs per run on its path (usually one shared head and one
question), not per block. A run splits where a call stops or branches inside it, where a
drop or an eviction takes part of it; a run none of whose blocks is present any more (a
*hole*) stays in the tree only while runs below it are present.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Generic, TypeVar

V = TypeVar("V")
_NEVER = float("-inf")

# Most runs are held by one node: stored as a (node_id, last_seen) tuple; a run seen on
# several nodes holds a dict (insertion order = the order nodes first touched it).
Holders = tuple[str, float] | dict[str, float]


def _seen(holders: Holders | None, node_id: str) -> float:
    if holders is None:
        return _NEVER
    if type(holders) is tuple:
        return holders[1] if holders[0] == node_id else _NEVER
    return holders.get(node_id, _NEVER)  # type: ignore[union-attr]


def _count(holders: Holders) -> int:
    return 1 if type(holders) is tuple else len(holders)


def _common(hashes: list[int], start: int, other: list[int]) -> int:
    """Length of the common head of ``hashes[start:]`` and ``other``."""
    k = 0
    for a, b in zip(islice(hashes, start, None), other, strict=False):
        if a != b:
            break
        k += 1
    return k


class _Run:
    """Consecutive blocks of one branch with the same holders (None: none present)."""

    __slots__ = ("children", "hashes", "holders", "next", "parent", "prev")

    def __init__(self, hashes: list[int], holders: Holders | None, parent: _Run | None) -> None:
        self.hashes = hashes  # chain order; its own list (never a caller's)
        self.holders = holders
        self.parent = parent
        self.children: dict[int, _Run] = {}  # first hash → run below this one
        # neighbours in the LRU list while present, else _UNLINKED (not the run itself:
        # a removed run must be freed at once, not left to the cyclic GC)
        self.prev: _Run = _UNLINKED
        self.next: _Run = _UNLINKED


_UNLINKED = object.__new__(_Run)
_UNLINKED.prev = _UNLINKED.next = _UNLINKED


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
        self._roots: dict[int, _Run] = {}  # first block hash → run
        # Present runs, least recently touched first (a circular list through a sentinel).
        # A run's blocks sit together in the per-block order, deepest first.
        self._lru = _Run([], None, None)
        self._lru.prev = self._lru.next = self._lru
        self._entries = 0
        self._num_blocks = 0
        self.evictions = 0
        self.expirations = 0

    def __len__(self) -> int:
        return self._entries

    def stats(self) -> IndexStats:
        return IndexStats(self._entries, self._num_blocks, self.evictions, self.expirations)

    # ---- runs -------------------------------------------------------------------------

    def _split(self, run: _Run, k: int) -> _Run:
        """Cut ``run`` after its first ``k`` blocks; ``run`` keeps the rest (its place in
        the LRU list and its children) and the returned new run, its parent, the head."""
        hashes = run.hashes
        holders = run.holders
        head = _Run(hashes[:k], dict(holders) if type(holders) is dict else holders, run.parent)
        rest = run.hashes = hashes[k:]
        siblings = self._roots if run.parent is None else run.parent.children
        siblings[hashes[0]] = head
        head.children[rest[0]] = run
        run.parent = head
        if holders is not None:  # the head's blocks come right after the rest's
            after = run.next
            head.prev = run
            head.next = after
            after.prev = head
            run.next = head
        return head

    def _clear(self, run: _Run) -> None:
        """None of the run's blocks is present any more: unlink it, prune empty branches."""
        prev, after = run.prev, run.next
        prev.next = after
        after.prev = prev
        run.prev = run.next = _UNLINKED
        run.holders = None
        while run.holders is None and not run.children:
            parent = run.parent
            del (self._roots if parent is None else parent.children)[run.hashes[0]]
            if parent is None:
                break
            run = parent

    def _path(self, hashes: list[int]) -> tuple[list[int], list[_Run], int]:
        """The runs along ``hashes`` from the root: their start positions, the runs, and
        how many leading blocks of ``hashes`` the tree has (present or not)."""
        starts: list[int] = []
        runs: list[_Run] = []
        n = len(hashes)
        i = 0
        run = self._roots.get(hashes[0]) if n else None
        while run is not None:
            own = run.hashes
            end = i + len(own)
            starts.append(i)
            runs.append(run)
            if end <= n and hashes[i:end] == own:
                i = end
                run = run.children.get(hashes[i]) if i < n else None
            else:
                i += _common(hashes, i, own)
                break
        return starts, runs, i

    def _remove_node(self, run: _Run, node_id: str) -> bool:
        """Remove one node from the run's holders; True when it was there."""
        holders = run.holders
        if type(holders) is tuple:
            if holders[0] != node_id:
                return False
            self._num_blocks -= len(run.hashes)
            self._clear(run)
            return True
        if holders is None or holders.pop(node_id, None) is None:  # type: ignore[union-attr]
            return False
        if len(holders) == 1:  # type: ignore[arg-type]
            ((other, seen),) = holders.items()  # type: ignore[union-attr]
            run.holders = (other, seen)
        return True

    def _present_runs(self) -> list[_Run]:
        runs = []
        run = self._lru.next
        while run is not self._lru:
            runs.append(run)
            run = run.next
        return runs

    def block_table(self) -> OrderedDict[int, Holders]:
        """Every present block and its holders, least recently touched first: the
        per-block view the runs stand for (for tests and inspection; O(blocks))."""
        table: OrderedDict[int, Holders] = OrderedDict()
        for run in self._present_runs():
            holders = run.holders
            assert holders is not None
            for h in reversed(run.hashes):
                table[h] = dict(holders) if type(holders) is dict else holders
        return table

    # ---- the index --------------------------------------------------------------------

    def record(self, node_id: str, block_hashes: Sequence[int], now: float) -> None:
        hashes = block_hashes if type(block_hashes) is list else list(block_hashes)
        n = len(hashes)
        held = (node_id, now)  # one shared tuple: tuples are never mutated
        added = 0
        path: list[_Run] = []
        children = self._roots
        parent: _Run | None = None
        i = 0
        while i < n:
            run = children.get(hashes[i])
            if run is None:
                run = _Run(hashes[i:], held, parent)
                children[hashes[i]] = run
                added += n - i
                self._num_blocks += n - i
                path.append(run)
                break
            size = len(run.hashes)
            end = i + size
            if end > n or hashes[i:end] != run.hashes:
                # the prompt stops or branches inside this run: touch its head only
                size = _common(hashes, i, run.hashes)
                run = self._split(run, size)
                end = i + size
            holders = run.holders
            if holders is None:
                run.holders = held
                added += size
                self._num_blocks += size
            elif type(holders) is tuple:
                if holders[0] == node_id:
                    run.holders = held
                else:
                    run.holders = {holders[0]: holders[1], node_id: now}
                    added += size
            else:
                if node_id not in holders:
                    added += size
                holders[node_id] = now  # type: ignore[index]
            path.append(run)
            parent = run
            children = run.children
            i = end
        # Touched deepest-first: the path's runs go to the back of the LRU list, deepest first.
        lru = self._lru
        for run in reversed(path):
            after = run.next
            if after is not _UNLINKED:
                prev = run.prev
                prev.next = after
                after.prev = prev
            last = lru.prev
            run.prev = last
            run.next = lru
            last.next = run
            lru.prev = run
        self._entries += added
        self.expire(now)
        while self._entries > self.max_entries:
            self._evict_front()

    def _evict_front(self) -> None:
        """Evict least recently touched blocks until the entries fit (within one run)."""
        front = self._lru.next
        holders = front.holders
        assert holders is not None
        per_block = _count(holders)
        size = len(front.hashes)
        need = -(-(self._entries - self.max_entries) // per_block)  # blocks, deepest first
        if need < size:
            self._split(front, size - need)
            size = need
        self._entries -= per_block * size
        self.evictions += per_block * size
        self._num_blocks -= size
        self._clear(front)

    def expire(self, now: float) -> int:
        """Drop blocks nobody touched within the TTL; returns entries removed."""
        cutoff = now - self.ttl_s
        removed = 0
        lru = self._lru
        front = lru.next
        while front is not lru:
            holders = front.holders
            # the front run is the least recently touched; its newest time is its touch
            if type(holders) is tuple:
                if holders[1] >= cutoff:
                    break
                per_block = 1
            else:
                if max(holders.values()) >= cutoff:  # type: ignore[union-attr]
                    break
                per_block = len(holders)  # type: ignore[arg-type]
            size = len(front.hashes)
            removed += per_block * size
            self._num_blocks -= size
            after = front.next
            self._clear(front)
            front = after
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
        """``CacheSignal.match``: blocks served within ``max_age_s`` if given, else the TTL."""
        if not block_hashes:
            return {}
        cutoff = now - (self.ttl_s if max_age_s is None else min(max_age_s, self.ttl_s))
        first_run = self._roots.get(block_hashes[0])
        if first_run is None or first_run.holders is None:
            return {}
        first = first_run.holders
        pairs = [first] if type(first) is tuple else first.items()  # type: ignore[union-attr]
        if nodes is None:
            alive = [n for n, t in pairs if t >= cutoff]
        else:
            allowed = nodes if isinstance(nodes, (set, frozenset, dict)) else set(nodes)
            alive = [n for n, t in pairs if t >= cutoff and n in allowed]
        if not alive:
            return {}
        hashes = block_hashes if type(block_hashes) is list else list(block_hashes)
        starts, runs, covered = self._path(hashes)
        n_blocks = len(hashes)

        def holders_at(i: int) -> Holders | None:
            """The holders of block i (None: not present), as a per-block table says."""
            if i >= covered:
                return None
            return runs[bisect_right(starts, i) - 1].holders

        result: dict[str, int] = {}
        tail = holders_at(n_blocks - 1) if n_blocks > 1 else None
        for node in alive:
            # Fast path for full hits: a node holding the last block holds the whole chain.
            if tail is not None and _seen(tail, node) >= cutoff:
                result[node] = n_blocks
                continue
            # Binary search; invariant: blocks [0, lo) are on the node, block hi is not
            # (or hi is the end of the chain). The probes are a per-block table's, so a
            # chain with gaps (after a drop) gives the same answer as one.
            lo, hi = 1, (n_blocks - 1 if tail is not None else n_blocks)
            while lo < hi:
                mid = (lo + hi) // 2
                if _seen(holders_at(mid), node) >= cutoff:
                    lo = mid + 1
                else:
                    hi = mid
            result[node] = lo
        return result

    def drop(self, node_id: str, block_hashes: Sequence[int], start: int = 0) -> int:
        """Forget that ``node_id`` holds ``block_hashes[start:]`` (demotion, a failed
        attempt); returns entries removed. ``block_hashes`` is a chain as recorded (from
        its first block) or a stretch of one; with ``start`` the blocks before it are only
        the way to the dropped ones (which a stretch without them has to be searched for)."""
        hashes = block_hashes if type(block_hashes) is list else list(block_hashes)
        n = len(hashes)
        if start >= n:
            return 0
        run = self._roots.get(hashes[0])
        if run is None:
            if start:
                return 0
            found = self._find(hashes[0])
            if found is None:
                return 0  # not present anywhere
            head = found
            return self.drop(node_id, head + hashes, len(head))
        removed = 0
        i = 0
        while run is not None:
            size = len(run.hashes)
            end = i + size
            whole = end <= n and hashes[i:end] == run.hashes
            k = size if whole else _common(hashes, i, run.hashes)
            below = run.children.get(hashes[end]) if whole and end < n else None
            skip = start - i if start > i else 0
            if skip < k and (
                node_id in run.holders  # type: ignore[operator]
                if type(run.holders) is dict
                else run.holders is not None and run.holders[0] == node_id  # type: ignore[index]
            ):
                target = run if k == size else self._split(run, k)
                if skip:
                    self._split(target, skip)  # target keeps blocks skip..k
                size_dropped = k - skip
                self._remove_node(target, node_id)
                removed += size_dropped
            if not whole:
                break
            run = below
            i = end
        self._entries -= removed
        return removed

    def _find(self, h: int) -> list[int] | None:
        """The chain from the root up to (not including) block ``h``; None if absent."""
        stack = list(self._roots.values())
        while stack:
            run = stack.pop()
            if h in run.hashes:
                head = run.hashes[: run.hashes.index(h)]
                up = run.parent
                while up is not None:
                    head = up.hashes + head
                    up = up.parent
                return head
            stack.extend(run.children.values())
        return None

    def purge_node(self, node_id: str) -> int:
        """Forget everything about a node (restart, removal); returns entries removed.

        A scan of the present runs: it runs on restarts and removals only.
        """
        removed = 0
        for run in self._present_runs():
            size = len(run.hashes)
            if self._remove_node(run, node_id):
                removed += size
        self._entries -= removed
        return removed


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
