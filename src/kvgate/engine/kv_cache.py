"""Paged KV cache with automatic prefix caching (the shape of vLLM v1's block pool).

* ``BlockPool`` owns ``num_blocks`` blocks. Each block has a reference count and, once
  it holds a full block of prompt tokens, a chained block hash. Blocks with reference
  count 0 sit in the free queue, ordered by eviction: the front is evicted first.
* A freed block keeps its hash and stays findable in the cache map until it is handed
  out again (evicted), so a later request with the same prefix reuses it.
* ``KVCacheManager`` maps requests to their blocks: prefix lookup, slot allocation,
  caching newly filled blocks and freeing.

Cache events (off unless ``BlockPool.events`` is a list): the pool appends ``CacheEvent``
records — ``("stored", parent, [h…], token_ids)`` when full blocks enter the cache map, ``("removed", None, [h])`` when a cached block is evicted or reset,
``("cleared", None, [])`` when a reset leaves nothing cached. The owner drains them and
publishes them (engine-sim: vLLM's KV event wire format) or feeds them to an index (sim).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from itertools import islice
from typing import NamedTuple


class CacheEvent(NamedTuple):
    kind: str  # "stored" | "removed" | "cleared"
    parent: int | None  # stored: hash of the block before the first one (None: root)
    hashes: list[int]
    token_ids: Sequence[int] = ()  # stored: the blocks' token ids, when the request has them


_LOOKUP_MEMO = 64  # first hashes a pool remembers lookups for (then it starts over)


_POSITIVE = (0).__lt__
_BLOCK_IDS: list[int] = []  # one int object per block id, shared by every pool


def _block_ids(first: int, last: int) -> list[int]:
    """Block ids ``first`` .. ``last - 1`` as the shared int objects: a pool's lists then
    hold references to one compact table instead of ints scattered over the heap (one
    per block per pool), which the per-block loops would otherwise read from cold memory."""
    if last > len(_BLOCK_IDS):
        _BLOCK_IDS.extend(range(len(_BLOCK_IDS), last))
    return _BLOCK_IDS[first:last]


class _Run:
    """The cached blocks one ``free`` call queued, in eviction order.

    A block taken back out of the queue (``touch``) is not removed from ``blocks``: its
    entry goes dead (the block's ``BlockPool._ref`` no longer holds this run's id: it is
    in use or queued in a later run), so freeing and reusing a prefix costs a list append
    and one slot write per block rather than an ordered-dict insert and delete. ``live``
    counts the entries still in the queue, ``pos`` is the next entry to evict (all before
    it are gone)."""

    __slots__ = ("blocks", "live", "pos")

    def __init__(self, blocks: list[int]) -> None:
        self.blocks = blocks
        self.live = len(blocks)
        self.pos = 0


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError("num_blocks must be >= 1")
        self.num_blocks = num_blocks
        # per block, one slot (the per-block loops then read one cold list, not two):
        # > 0, the reference count of a block in use; 0, a free block outside the queue
        # (spare or fresh, below); < 0, a free block queued in the run with that id
        self._ref = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}  # block hash -> block id
        # The free queue in eviction order is three runs, taken front to back:
        # ``_spare``, free blocks holding no cached content, a stack (the last is next);
        # ``_fresh`` .. num_blocks - 1, blocks never handed out (so none is built at start);
        # the queue of blocks freed while holding cached content, oldest first: ``_runs``,
        # one ``_Run`` per ``free`` call in call order, keyed by a negative id (-1, -2, …).
        # A run's entry for a block is live while the block's ``_ref`` slot holds the id;
        # ``_queued`` counts live entries. Only the queue can hold cached blocks, so only
        # it is evicted from.
        self._spare: list[int] = []
        self._fresh = 0
        self._runs: OrderedDict[int, _Run] = OrderedDict()
        self._next_run = -1
        self._queued = 0
        self.evictions = 0
        self.events: list[CacheEvent] | None = None  # None: no cache events recorded
        # ``lookup`` remembers its last answer per first hash: (removals then, the hashes
        # found, their blocks). The map only gains entries between two removals (a hash
        # keeps its block until it is removed), so while none happened the remembered
        # run is still cached and only the hashes after it need probing; after removals
        # it is checked against ``block_hash`` in one C-level pass.
        self._removals = 0
        self._lookups: dict[int, tuple[int, list[int], list[int]]] = {}

    @property
    def ref_cnt(self) -> list[int]:
        """Reference count per block (a copy: for inspection)."""
        return [c if c > 0 else 0 for c in self._ref]

    def count_free(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` are free."""
        return len(blocks) - sum(map(_POSITIVE, map(self._ref.__getitem__, blocks)))

    def drain_events(self) -> list[CacheEvent]:
        """Cache events recorded since the last drain (empty when events are off)."""
        events = self.events
        if not events:
            return []
        self.events = []
        return events

    @property
    def num_free(self) -> int:
        return len(self._spare) + self.num_blocks - self._fresh + self._queued

    def usage(self) -> float:
        return 1.0 - self.num_free / self.num_blocks

    def eviction_order(self) -> list[int]:
        """Every free block, next to be reused first."""
        return [*reversed(self._spare), *range(self._fresh, self.num_blocks), *self._queue()]

    def _queue(self) -> Iterator[int]:
        """The freed cached blocks, next to be evicted first (the live entries)."""
        ref = self._ref
        for rid, run in self._runs.items():
            for b in islice(run.blocks, run.pos, None):
                if ref[b] == rid:
                    yield b

    def lookup(self, hashes: Sequence[int]) -> list[int]:
        """Block ids of the longest cached run of leading hashes (no side effects)."""
        if not hashes:
            return []
        known = self._lookups.get(hashes[0])
        if (
            known is not None
            and type(hashes) is list
            and hashes[: len(known[1])] == known[1]
            and (
                known[0] == self._removals
                # removals since (once the pool is full, every new block evicts one): the
                # run still stands if each of its blocks holds its hash, as a block holds
                # a hash exactly while the map gives that hash this block
                or list(map(self.block_hash.__getitem__, known[2])) == known[1]
            )
        ):
            out = known[2][:]
            if known[0] != self._removals:
                known = self._lookups[hashes[0]] = (self._removals, known[1], known[2])
        else:
            known = None
            out = []
        start = len(out)
        get = self.cached.get
        for i in range(start, len(hashes)):
            block = get(hashes[i])
            if block is None:
                break
            out.append(block)
        if len(out) > start and type(hashes) is list:
            if known is None and len(self._lookups) >= _LOOKUP_MEMO:
                self._lookups.clear()
            self._lookups[hashes[0]] = (self._removals, hashes[: len(out)], out[:])
        return out

    def touch(self, blocks: Sequence[int]) -> None:
        """Take a reference on cached blocks (removing free ones from the free queue).

        ``blocks`` holds no block twice (a request's prefix never does)."""
        ref = self._ref
        slots = list(map(ref.__getitem__, blocks))
        if not slots:
            return
        if min(slots) > 0:  # all in use already (a prefix shared with running requests)
            for b in blocks:
                ref[b] += 1
            return
        rid = slots[0]
        if rid < 0 and slots.count(rid) == len(slots):
            # the usual case: a prefix one request freed, all still queued
            for b in blocks:
                ref[b] = 1
            self._take(rid, blocks if type(blocks) is list else list(blocks))
            return
        by_run: dict[int, list[int]] = {}
        for b, c in zip(blocks, slots, strict=True):
            if c > 0:
                ref[b] = c + 1
                continue
            ref[b] = 1
            if c:
                by_run.setdefault(c, []).append(b)
            else:
                self._take_uncached(b)
        for rid, taken in by_run.items():
            self._take(rid, taken)

    def _take(self, rid: int, taken: list[int]) -> None:
        """Account for ``taken`` (live entries of run ``rid``, now in use) leaving the queue."""
        k = len(taken)
        self._queued -= k
        run = self._runs[rid]
        run.live -= k
        if not run.live:
            del self._runs[rid]
            return
        blocks = run.blocks
        if blocks[-k:] == taken[::-1]:
            # the run's tail (a prefix freed last, as a request frees tail first): drop it
            del blocks[-k:]
        if len(blocks) - run.pos > 2 * run.live:
            # mostly dead entries: keep the live ones (each compaction at least halves it)
            ref = self._ref
            run.blocks = [b for b in islice(blocks, run.pos, None) if ref[b] == rid]
            run.pos = 0

    def _take_uncached(self, b: int) -> None:
        """Remove a free block that holds no cached content (not a path the engine takes)."""
        if self._fresh < self.num_blocks:
            # Put the never-used run under the spare stack: the same order, one run.
            self._spare[:0] = _block_ids(self._fresh, self.num_blocks)[::-1]
            self._fresh = self.num_blocks
        self._spare.remove(b)

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks from the front of the free queue, evicting their hashes."""
        if n > self.num_free:
            raise RuntimeError("not enough free blocks")
        out: list[int] = []
        ref = self._ref
        spare = self._spare
        while spare and n:
            b = spare.pop()
            ref[b] = 1
            out.append(b)
            n -= 1
        if n and self._fresh < self.num_blocks:
            first = self._fresh
            last = min(first + n, self.num_blocks)
            out += _block_ids(first, last)
            ref[first:last] = [1] * (last - first)
            self._fresh = last
            n -= last - first
        if not n:
            return out
        block_hash = self.block_hash
        cached = self.cached
        events = self.events
        runs = self._runs
        self._queued -= n
        removals = evictions = 0
        while n:
            rid = next(iter(runs))
            run = runs[rid]
            blocks = run.blocks
            pos = run.pos
            live = run.live
            while n and live:
                b = blocks[pos]
                pos += 1
                if ref[b] != rid:
                    continue  # a dead entry
                live -= 1
                n -= 1
                h = block_hash[b]
                if h is not None:
                    block_hash[b] = None
                    if cached.get(h) == b:
                        del cached[h]
                        removals += 1
                        if events is not None:
                            if events and events[-1].kind == "removed":
                                events[-1].hashes.append(h)
                            else:
                                events.append(CacheEvent("removed", None, [h]))
                    evictions += 1
                ref[b] = 1
                out.append(b)
            if live:
                run.pos = pos
                run.live = live
            else:
                del runs[rid]
        self._removals += removals
        self.evictions += evictions
        return out

    def cache_block(self, block: int, h: int) -> bool:
        """Record that ``block`` now holds the full block with hash ``h``; True when it
        entered the cache map."""
        if self.block_hash[block] is not None:
            return False
        if h in self.cached:
            # Another block already holds this content (computed concurrently); keep
            # the first, this copy stays private to its request.
            return False
        self.block_hash[block] = h
        self.cached[h] = block
        return True

    def free(self, blocks: Sequence[int]) -> None:
        """Drop one reference from each block of a request.

        Blocks are released tail first, so a request's last blocks are evicted before
        its first ones (the shared prefix stays longest). Blocks holding no cached
        content go to the front: reusing them costs no cache.
        """
        ref = self._ref
        block_hash = self.block_hash
        spare = self._spare
        rid = self._next_run
        queued: list[int] = []
        queue = queued.append
        for b in reversed(blocks):
            c = ref[b]
            if c != 1:
                ref[b] = c - 1
            elif block_hash[b] is None:
                ref[b] = 0
                spare.append(b)
            else:
                ref[b] = rid
                queue(b)
        if queued:
            self._runs[rid] = _Run(queued)
            self._next_run = rid - 1
            self._queued += len(queued)

    def reset_prefix_cache(self) -> int:
        """Forget the hashes of all free cached blocks; returns how many were dropped."""
        dropped = 0
        removed: list[int] = []
        for b in self._queue():
            h = self.block_hash[b]
            if h is not None:
                self.block_hash[b] = None
                if self.cached.get(h) == b:
                    del self.cached[h]
                    self._removals += 1
                    removed.append(h)
                dropped += 1
        if self.events is not None and removed:
            # Blocks still in use stay cached (as vLLM keeps them): say exactly what went.
            cleared = not self.cached
            self.events.append(
                CacheEvent("cleared", None, []) if cleared else CacheEvent("removed", None, removed)
            )
        return dropped


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class KVCacheManager:
    """Per-request block tables on top of a ``BlockPool``."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.tables: dict[str, list[int]] = {}

    def enable_events(self) -> None:
        """Start recording cache events (``pool.drain_events`` hands them out)."""
        if self.pool.events is None:
            self.pool.events = []

    def cached_prefix_blocks(self, hashes: Sequence[int], num_prompt_tokens: int) -> list[int]:
        """Cached blocks a new request can reuse.

        As in vLLM, at least the last prompt token is always computed, so a prompt that
        is entirely cached gives back its last block.
        """
        blocks = self.pool.lookup(hashes)
        if blocks and len(blocks) * self.block_size >= num_prompt_tokens:
            blocks = blocks[:-1]
        return blocks

    def can_allocate(self, request_id: str, total_tokens: int, new_cached: Sequence[int]) -> bool:
        table = self.tables.get(request_id, ())
        need = blocks_for(total_tokens, self.block_size) - len(table) - len(new_cached)
        # Cached blocks that are free now leave the free queue when touched.
        free_cached = self.pool.count_free(new_cached)
        return need <= self.pool.num_free - free_cached

    def allocate(self, request_id: str, total_tokens: int, new_cached: Sequence[int] = ()) -> bool:
        """Make room for ``total_tokens`` tokens of a request; False if blocks run out."""
        table = self.tables.get(request_id)
        if table is None:
            table = self.tables[request_id] = []
        pool = self.pool
        need = -(-total_tokens // self.block_size) - len(table) - len(new_cached)
        if new_cached:
            # Cached blocks that are free now leave the free queue when touched; count
            # them only when the room is in doubt (it is not when all of them could be).
            free_now = pool.num_free
            if need > free_now - len(new_cached) and need > free_now - pool.count_free(new_cached):
                if not table:
                    del self.tables[request_id]
                return False
            pool.touch(new_cached)
            table.extend(new_cached)
        elif need <= 0:
            return True
        elif need > pool.num_free:
            if not table:
                del self.tables[request_id]
            return False
        if need > 0:
            table.extend(pool.allocate(need))
        return True

    def cache_full_blocks(
        self,
        request_id: str,
        hashes: Sequence[int],
        num_computed_tokens: int,
        start: int = 0,
        token_ids: Sequence[int] | None = None,
    ) -> int:
        """Hash the request's blocks (from index ``start``) that are full of computed
        prompt tokens; returns the number of leading blocks now hashed. ``token_ids``
        (the prompt's, when known) only goes into the cache events."""
        table = self.tables.get(request_id)
        if not table:
            return start
        n_full = min(num_computed_tokens // self.block_size, len(hashes), len(table))
        pool = self.pool
        events = pool.events
        if events is None:
            block_hash = pool.block_hash
            cached = pool.cached
            for i in range(start, n_full):
                b = table[i]
                if block_hash[b] is None:
                    # pool.cache_block(b, hashes[i]), inlined: this loop runs per prompt block
                    h = hashes[i]
                    if h not in cached:
                        block_hash[b] = h
                        cached[h] = b
            return max(start, n_full)
        bs = self.block_size
        run: list[int] = []  # consecutive newly stored blocks → one "stored" event
        first = 0

        def emit() -> None:
            tokens = token_ids[first * bs : (first + len(run)) * bs] if token_ids else ()
            events.append(
                CacheEvent("stored", hashes[first - 1] if first > 0 else None, run, tokens)
            )

        for i in range(start, n_full):
            b = table[i]
            if pool.block_hash[b] is None and pool.cache_block(b, hashes[i]):
                if not run:
                    first = i
                run.append(hashes[i])
            elif run:
                emit()
                run = []
        if run:
            emit()
        return max(start, n_full)

    def free(self, request_id: str) -> None:
        table = self.tables.pop(request_id, None)
        if table:
            self.pool.free(table)
