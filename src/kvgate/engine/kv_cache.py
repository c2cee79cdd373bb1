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
from collections.abc import Sequence
from typing import NamedTuple


class CacheEvent(NamedTuple):
    kind: str  # "stored" | "removed" | "cleared"
    parent: int | None  # stored: hash of the block before the first one (None: root)
    hashes: list[int]
    token_ids: Sequence[int] = ()  # stored: the blocks' token ids, when the request has them


_LOOKUP_MEMO = 64  # first hashes a pool remembers lookups for (then it starts over)


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError("num_blocks must be >= 1")
        self.num_blocks = num_blocks
        self.ref_cnt = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}  # block hash -> block id
        # The free queue in eviction order is three runs, taken front to back:
        # ``_spare``, free blocks holding no cached content, a stack (the last is next);
        # ``_fresh`` .. num_blocks - 1, blocks never handed out (so none is built at start);
        # ``free_queue``, blocks freed while holding cached content, oldest first.
        # Only ``free_queue`` can hold cached blocks, so only it is evicted from.
        self._spare: list[int] = []
        self._fresh = 0
        self.free_queue: OrderedDict[int, None] = OrderedDict()  # values unused
        self.evictions = 0
        self.events: list[CacheEvent] | None = None  # None: no cache events recorded
        # ``lookup`` remembers its last answer per first hash: (removals then, the hashes
        # found, their blocks). The map only gains entries between two removals (a hash
        # keeps its block until it is removed), so while none happened the remembered
        # run is still cached and only the hashes after it need probing; after removals
        # it is checked against ``block_hash`` in one C-level pass.
        self._removals = 0
        self._lookups: dict[int, tuple[int, list[int], list[int]]] = {}

    def drain_events(self) -> list[CacheEvent]:
        """Cache events recorded since the last drain (empty when events are off)."""
        events = self.events
        if not events:
            return []
        self.events = []
        return events

    @property
    def num_free(self) -> int:
        return len(self._spare) + self.num_blocks - self._fresh + len(self.free_queue)

    def usage(self) -> float:
        return 1.0 - self.num_free / self.num_blocks

    def eviction_order(self) -> list[int]:
        """Every free block, next to be reused first."""
        return [*reversed(self._spare), *range(self._fresh, self.num_blocks), *self.free_queue]

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
        """Take a reference on cached blocks (removing free ones from the free queue)."""
        ref_cnt = self.ref_cnt
        free_queue = self.free_queue
        for b in blocks:
            if ref_cnt[b] == 0:
                if b in free_queue:
                    del free_queue[b]
                else:
                    self._take_uncached(b)
            ref_cnt[b] += 1

    def _take_uncached(self, b: int) -> None:
        """Remove a free block that holds no cached content (not a path the engine takes)."""
        if self._fresh < self.num_blocks:
            # Put the never-used run under the spare stack: the same order, one run.
            self._spare[:0] = range(self.num_blocks - 1, self._fresh - 1, -1)
            self._fresh = self.num_blocks
        self._spare.remove(b)

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks from the front of the free queue, evicting their hashes."""
        if n > self.num_free:
            raise RuntimeError("not enough free blocks")
        out: list[int] = []
        ref_cnt = self.ref_cnt
        spare = self._spare
        while spare and n:
            b = spare.pop()
            ref_cnt[b] = 1
            out.append(b)
            n -= 1
        if n and self._fresh < self.num_blocks:
            first = self._fresh
            last = min(first + n, self.num_blocks)
            out.extend(range(first, last))
            ref_cnt[first:last] = [1] * (last - first)
            self._fresh = last
            n -= last - first
        if not n:
            return out
        popitem = self.free_queue.popitem
        block_hash = self.block_hash
        cached = self.cached
        events = self.events
        removals = evictions = 0
        for _ in range(n):
            b, _unused = popitem(False)
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
            ref_cnt[b] = 1
            out.append(b)
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
        ref_cnt = self.ref_cnt
        block_hash = self.block_hash
        free_queue = self.free_queue
        spare = self._spare
        for b in reversed(blocks):
            left = ref_cnt[b] - 1
            ref_cnt[b] = left
            if left == 0:
                if block_hash[b] is None:
                    spare.append(b)
                else:
                    free_queue[b] = None

    def reset_prefix_cache(self) -> int:
        """Forget the hashes of all free cached blocks; returns how many were dropped."""
        dropped = 0
        removed: list[int] = []
        for b in self.free_queue:
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
        free_cached = list(map(self.pool.ref_cnt.__getitem__, new_cached)).count(0)
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
            if need > free_now - len(new_cached) and need > free_now - list(
                map(pool.ref_cnt.__getitem__, new_cached)
            ).count(0):
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
