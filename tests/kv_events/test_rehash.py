"""SGLang-style streams: engine hashes the gateway cannot reproduce, re-keyed by tokens."""

from __future__ import annotations

import msgspec

from kvgate.kv_events.config import NodeEventsConfig
from kvgate.kv_events.hashing import TokenBlockHasher
from kvgate.kv_events.index import PreciseIndex
from kvgate.kv_events.rehash import TokenRehasher
from kvgate.kv_events.wire import decode_batch

HASHER = TokenBlockHasher(16, "sha256_cbor", seed="0")


def _batch(events: list[list[object]]) -> bytes:
    return msgspec.msgpack.encode([1.0, events])


def test_engine_hashes_are_rekeyed_by_token_ids() -> None:
    tokens = list(range(1000, 1064))  # four blocks
    index = PreciseIndex()
    rehasher = TokenRehasher(HASHER)
    # The engine's own (opaque) hashes: 901..904; stored in two events, chained by parent.
    first = ["BlockStored", [901, 902], None, tokens[:32], 16, None, None]
    second = ["BlockStored", [903, 904], 902, tokens[32:], 16, None, None]
    index.apply("s", rehasher.translate(decode_batch(_batch([first, second]))), 0.0)
    ours = HASHER.hashes(tokens)  # what the gateway computes for a request
    assert index.match(ours, 0.0) == {"s": 4}
    # Removal names engine hashes only; the rehasher remembers which of ours they are.
    index.apply("s", rehasher.translate(decode_batch(_batch([["BlockRemoved", [903], None]]))), 0.0)
    assert index.match(ours, 0.0) == {"s": 2}
    # A block whose parent was never seen cannot be placed in a chain: skipped.
    orphan = ["BlockStored", [999], 12345, [7] * 16, 16, None, None]
    index.apply("s", rehasher.translate(decode_batch(_batch([orphan]))), 0.0)
    assert rehasher.skipped == 1
    # A different page size than the gateway's cannot be re-keyed either.
    paged1 = ["BlockStored", [1, 2], None, [5, 6], 1, None, None]
    rehasher.translate(decode_batch(_batch([paged1])))
    assert rehasher.skipped == 3
    index.apply("s", rehasher.translate(decode_batch(_batch([["AllBlocksCleared"]]))), 0.0)
    assert index.blocks_of("s") == frozenset()


def test_hash_source_follows_the_engine_type() -> None:
    ev = NodeEventsConfig(endpoint="tcp://127.0.0.1:5557")
    assert ev.hash_source("sglang") == "tokens"
    assert ev.hash_source("vllm") == "engine"
    assert NodeEventsConfig(endpoint="tcp://h:1", hashes="tokens").hash_source("vllm") == "tokens"
