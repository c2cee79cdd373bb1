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


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError("num_blocks must be >= 1")
        self.num_blocks = num_blocks
        self.ref_cnt = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}  # block hash -> block id
        # Free blocks in eviction order (front = next to be reused). Values unused.
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.evictions = 0
        self.events: list[CacheEvent] | None = None  # None: no cache events recorded

    def drain_events(self) -> list[CacheEvent]:
        """Cache events recorded since the last drain (empty when events are off)."""
        events = self.events
        if not events:
            return []
        self.events = []
        return events

    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    def usage(self) -> float:
        return 1.0 - len(self.free_queue) / self.num_blocks

    def lookup(self, hashes: Sequence[int]) -> list[int]:
        """Block ids of the longest cached run of leading hashes (no side effects)."""
        out: list[int] = []
        cached = self.cached
        for h in hashes:
            block = cached.get(h)
            if block is None:
                break
            out.append(block)
        return out

    def touch(self, blocks: Sequence[int]) -> None:
        """Take a reference on cached blocks (removing free ones from the free queue)."""
        for b in blocks:
            if self.ref_cnt[b] == 0:
                del self.free_queue[b]
            self.ref_cnt[b] += 1

    def allocate(self, n: int) -> list[int]:
        """Pop ``n`` blocks from the front of the free queue, evicting their hashes."""
        if n > len(self.free_queue):
            raise RuntimeError("not enough free blocks")
        out: list[int] = []
        for _ in range(n):
            b, _unused = self.free_queue.popitem(last=False)
            h = self.block_hash[b]
            if h is not None:
                self.block_hash[b] = None
                if self.cached.get(h) == b:
                    del self.cached[h]
                    events = self.events
                    if events is not None:
                        if events and events[-1].kind == "removed":
                            events[-1].hashes.append(h)
                        else:
                            events.append(CacheEvent("removed", None, [h]))
                self.evictions += 1
            self.ref_cnt[b] = 1
            out.append(b)
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
        for b in reversed(blocks):
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                self.free_queue[b] = None
                if self.block_hash[b] is None:
                    self.free_queue.move_to_end(b, last=False)

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
        free_cached = sum(1 for b in new_cached if self.pool.ref_cnt[b] == 0)
        return need <= self.pool.num_free - free_cached

    def allocate(self, request_id: str, total_tokens: int, new_cached: Sequence[int] = ()) -> bool:
        """Make room for ``total_tokens`` tokens of a request; False if blocks run out."""
        table = self.tables.get(request_id)
        if table is None:
            table = self.tables[request_id] = []
        pool = self.pool
        need = -(-total_tokens // self.block_size) - len(table) - len(new_cached)
        if new_cached:
            free_cached = sum(1 for b in new_cached if pool.ref_cnt[b] == 0)
            if need > len(pool.free_queue) - free_cached:
                if not table:
                    del self.tables[request_id]
                return False
            pool.touch(new_cached)
            table.extend(new_cached)
        elif need > len(pool.free_queue):
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
            for i in range(start, n_full):
                b = table[i]
                if pool.block_hash[b] is None:
                    pool.cache_block(b, hashes[i])
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

    def num_blocks_of(self, request_id: str) -> int:
        return len(self.tables.get(request_id, ()))
