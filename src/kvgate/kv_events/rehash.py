"""Re-key an engine's events by hashes the gateway computes itself from their token ids.

For engines whose block hashes the gateway cannot reproduce (SGLang keys its radix cache
with its own, per-process hash), each ``BlockStored`` carries the blocks' token ids and its
parent's hash: the gateway re-hashes the tokens with its own chain (``TokenBlockHasher``,
vLLM's scheme) and remembers engine hash → own digest, so later children and
``BlockRemoved`` events (hashes only) can be translated. A stored block whose parent was
never seen, or whose token count does not fill its blocks, cannot be placed in a chain and
is skipped (``skipped``). With a fixed block size (``kv_events.block_size`` set) a block
of another size is skipped too; otherwise each event is re-hashed at the block size it
carries, the size the gateway then queries that node with (``NodeEventState.block_size``).
"""

from __future__ import annotations

from kvgate.kv_events.hashing import TokenBlockHasher, to_external
from kvgate.kv_events.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventBatch,
)


class TokenRehasher:
    def __init__(self, hasher: TokenBlockHasher, *, fixed: bool = True) -> None:
        self.hasher = hasher
        self.fixed = fixed
        self._hashers = {hasher.block_size: hasher}
        self._digests: dict[int, bytes] = {}  # engine block hash → our digest
        self.skipped = 0

    def reset(self) -> None:
        self._digests.clear()

    def _hasher(self, block_size: int) -> TokenBlockHasher | None:
        hasher = self._hashers.get(block_size)
        if hasher is None and not self.fixed and block_size > 0:
            base = self.hasher
            hasher = self._hashers[block_size] = TokenBlockHasher(block_size, base.algo, base.seed)
        return hasher

    def translate(self, batch: KVEventBatch) -> KVEventBatch:
        out: list[KVEvent] = []
        for ev in batch.events:
            mapped = self._event(ev)
            if mapped is not None:
                out.append(mapped)
        return KVEventBatch(batch.ts, out, batch.data_parallel_rank)

    def _event(self, ev: KVEvent) -> KVEvent | None:
        digests = self._digests
        if isinstance(ev, BlockStored):
            hasher = self._hasher(ev.block_size)
            n = len(ev.block_hashes)
            if hasher is None or len(ev.token_ids) != n * hasher.block_size:
                self.skipped += n
                return None
            parent: bytes | None = None
            if ev.parent_block_hash is not None:
                parent = digests.get(ev.parent_block_hash)
                if parent is None:
                    self.skipped += n
                    return None
            ours = hasher.digests(ev.token_ids, parent=parent)
            for engine_hash, digest in zip(ev.block_hashes, ours, strict=True):
                digests[engine_hash] = digest
            return BlockStored(
                [to_external(d) for d in ours],
                to_external(parent) if parent is not None else None,
                ev.token_ids,
                ev.block_size,
                ev.lora_id,
                ev.medium,
            )
        if isinstance(ev, BlockRemoved):
            gone = [to_external(d) for h in ev.block_hashes if (d := digests.pop(h, None))]
            return BlockRemoved(gone, ev.medium) if gone else None
        if isinstance(ev, AllBlocksCleared):
            digests.clear()
        return ev
