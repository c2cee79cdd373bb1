"""The engine model's cache events rebuild its true cache; vLLM-compatible hashing."""

from __future__ import annotations

import hashlib
import random

from kvgate.engine.core import EngineCore
from kvgate.engine.profiles import get_profile
from kvgate.engine.request import EngineRequest
from kvgate.kv_events.hashing import TokenBlockHasher, to_external
from kvgate.kv_events.index import PreciseIndex
from kvgate.sim.kv_event_feed import drain_batch
from kvgate.tokens import block_hashes

GEMMA = get_profile("gemma3-270m-cpu")


def _replay(core: EngineCore, index: PreciseIndex, now: float) -> None:
    index.apply("n", drain_batch(core, now), now)


def test_events_track_the_true_cache_through_eviction_and_reset() -> None:
    core = EngineCore(GEMMA, kv_blocks=40)  # small: prefixes evict each other
    core.scheduler.kv.enable_events()
    index = PreciseIndex()
    rng = random.Random(3)
    pool = core.scheduler.kv.pool
    t = 0.0
    evicted_before = pool.evictions
    for i in range(60):
        group = rng.randrange(6)
        prompt = 16 * rng.randint(3, 12) + rng.randrange(16)
        pieces = [f" g{group}_{k}" for k in range(prompt)]
        core.add_request(EngineRequest(f"r{i}", prompt, block_hashes(pieces), 4), t)
        t += rng.uniform(0.0, 0.3)
        core.advance_to(t)
        _replay(core, index, t)
        assert index.blocks_of("n") == set(pool.cached)
        if i == 40:
            core.reset_prefix_cache()
            _replay(core, index, t)
            assert index.blocks_of("n") == set(pool.cached)
    while (nxt := core.next_event_time()) is not None:
        core.advance_to(nxt)
    _replay(core, index, nxt or t)
    assert index.blocks_of("n") == set(pool.cached)
    assert pool.evictions > evicted_before  # the run did exercise eviction
    # With nothing running a reset empties the cache: one AllBlocksCleared.
    core.reset_prefix_cache()
    assert pool.drain_events() == [("cleared", None, [], ())]


def test_events_are_off_by_default() -> None:
    core = EngineCore(GEMMA)
    core.add_request(EngineRequest("a", 40, block_hashes([f" x{i}" for i in range(40)]), 2), 0.0)
    core.advance_to(10.0)
    assert core.scheduler.kv.pool.drain_events() == []


def _cbor_uint(n: int) -> bytes:
    if n < 24:
        return bytes([n])
    if n < 256:
        return bytes([0x18, n])
    return bytes([0x19]) + n.to_bytes(2, "big")


def test_sha256_cbor_chain_matches_a_hand_encoded_cbor() -> None:
    """sha256 over canonical CBOR of (parent digest, tuple(tokens), None), seeded by
    sha256(CBOR(PYTHONHASHSEED string)) — encoded here byte by byte (RFC 8949)."""
    seed = hashlib.sha256(b"\x61" + b"0").digest()  # text string "0"
    tokens = list(range(250, 282))  # two blocks of 16; ints ≥ 24 need the 1/2-byte forms

    def block(parent: bytes, toks: list[int]) -> bytes:
        body = b"\x83" + b"\x58\x20" + parent + bytes([0x90]) + b"".join(map(_cbor_uint, toks))
        return hashlib.sha256(body + b"\xf6").digest()

    h0 = block(seed, tokens[:16])
    h1 = block(h0, tokens[16:])
    hasher = TokenBlockHasher(16, "sha256_cbor", seed="0")
    assert hasher.none_hash == seed
    assert hasher.digests([*tokens, 1, 2, 3]) == [h0, h1]  # a partial tail has no hash
    assert hasher.hashes(tokens) == [to_external(h0), to_external(h1)]
    assert to_external(h0) == int.from_bytes(h0[-8:], "big")
    # A different seed (another PYTHONHASHSEED) gives different hashes.
    assert TokenBlockHasher(16, "sha256_cbor", seed="1").hashes(tokens) != hasher.hashes(tokens)
    assert TokenBlockHasher(16, "xxhash_cbor", seed="0").hashes(tokens) != hasher.hashes(tokens)
