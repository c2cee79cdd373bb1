"""Block hashes computed the way the engine computes them, so gateway and engine agree.

vLLM's prefix cache (v1) hashes a request's token ids in full blocks, as a chain::

    h_0 = H((NONE_HASH, tuple(tokens[0:B]), None))
    h_i = H((h_{i-1}, tuple(tokens[i*B:(i+1)*B]), None))

with ``H = sha256(cbor2.dumps(obj, canonical=True))`` (``--prefix-caching-hash-algo
sha256_cbor``; ``xxhash_cbor`` swaps sha256 for xxh3_128) and parents chained as the full
digest bytes. ``None`` is the extra-keys slot (LoRA, multimodal, cache salt): kvgate routes
plain text prompts, which have none. The seed ``NONE_HASH`` is ``H(PYTHONHASHSEED)`` — the
environment variable's *string* value — when that variable is set and 32 random bytes
otherwise, so reproducible hashes need the same ``PYTHONHASHSEED`` on every engine and on
the gateway (``hash_seed`` here). The CBOR variants are the ones whose bytes do not depend
on the Python process (``sha256`` pickles, the builtin ``hash`` is salted per process).

Published events carry the low 64 bits of each digest read big-endian (vLLM's default
``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``); ``to_external`` does the same, and the index keys
on those ints.

``kvgate`` is the other scheme: kvgate's own text model (``kvgate.tokens``), which
engine-sim uses when it has no tokenizer. Its hashes are already 64-bit ints.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import cbor2
import xxhash

HASH_ALGOS: tuple[str, ...] = ("sha256_cbor", "xxhash_cbor")
_MASK64 = (1 << 64) - 1


def sha256_cbor(obj: Any) -> bytes:
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def xxhash_cbor(obj: Any) -> bytes:
    return xxhash.xxh3_128_digest(cbor2.dumps(obj, canonical=True))


_HASH_FNS: dict[str, Callable[[Any], bytes]] = {
    "sha256_cbor": sha256_cbor,
    "xxhash_cbor": xxhash_cbor,
}


def to_external(digest: bytes) -> int:
    """A digest as the 64-bit int vLLM publishes in its events."""
    return int.from_bytes(digest, "big") & _MASK64


class TokenBlockHasher:
    """Chained block hashes of token ids (vLLM's scheme); one instance per model config."""

    def __init__(self, block_size: int = 16, algo: str = "sha256_cbor", seed: str = "0") -> None:
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        fn = _HASH_FNS.get(algo)
        if fn is None:
            raise ValueError(f"hash algo must be one of {', '.join(HASH_ALGOS)}; got {algo!r}")
        self.block_size = block_size
        self.algo = algo
        self.seed = seed
        self._fn = fn
        self.none_hash = fn(seed)

    def digests(self, token_ids: Sequence[int], parent: bytes | None = None) -> list[bytes]:
        """Full digests of the full blocks of ``token_ids`` (a partial tail has none)."""
        bs, fn = self.block_size, self._fn
        prev = parent if parent is not None else self.none_hash
        out: list[bytes] = []
        for start in range(0, len(token_ids) - len(token_ids) % bs, bs):
            prev = fn((prev, tuple(token_ids[start : start + bs]), None))
            out.append(prev)
        return out

    def hashes(self, token_ids: Sequence[int]) -> list[int]:
        """The 64-bit external hashes the engine's events carry for these blocks."""
        return [to_external(d) for d in self.digests(token_ids)]


def engine_cached_tokens(matched_blocks: int, prompt_tokens: int, block_size: int) -> int:
    """Prompt tokens an engine reuses from ``matched_blocks`` cached leading blocks: whole
    blocks, never the one holding the prompt's last token (vLLM looks up at most
    ``prompt_tokens - 1`` tokens: the last one is always computed, for its logits)."""
    usable = max(0, (prompt_tokens - 1) // block_size)
    return min(matched_blocks, usable) * block_size
