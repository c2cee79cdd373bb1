"""Recorded vLLM-format event batches (bytes) decoded into the precise index."""

from __future__ import annotations

import msgspec
import pytest

from kvgate.kv_events.index import PreciseIndex
from kvgate.kv_events.wire import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    WireError,
    decode_batch,
    encode_batch,
    hash_to_int,
    seq_from_bytes,
    seq_to_bytes,
)

# vLLM ≤ 0.11 layout (msgspec array_like, tag first), no data_parallel_rank:
#   [1700000000.5, [
#     ["BlockStored", [11, 12, 2**64-16], None, [0..47], 16, None, "GPU"],
#     ["BlockStored", [21], 12, [1]*16, 16, None, None],
#     ["BlockRemoved", [2**64-16], "GPU"],
#     ["BlockStored", [99], None, [2]*16, 16, None, "CPU"]]]       (offloaded copy)
ARRAY_BATCH = bytes.fromhex(
    "92cb41d954fc402000009497ab426c6f636b53746f726564930b0ccffffffffffffffff0c0dc003000010203"
    "0405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f"
    "10c0a347505597ab426c6f636b53746f72656491150cdc00100101010101010101010101010101010110c0c0"
    "93ac426c6f636b52656d6f76656491cffffffffffffffff0a347505597ab426c6f636b53746f7265649163c0"
    "dc00100202020202020202020202020202020210c0a3435055"
)

# Newer layout (map structs, "type" tag, extra lora_name field, digest-bytes hash,
# data_parallel_rank=1): stored [bytes 0…07], cleared, stored [31, 32].
MAP_BATCH = bytes.fromhex(
    "83a27473cb41d954fc40400000a66576656e74739388a474797065ab426c6f636b53746f726564ac626c6f63"
    "6b5f68617368657391c4200000000000000000000000000000000000000000000000000000000000000007b1"
    "706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473dc00100303030303030303030303030"
    "3030303aa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e61"
    "6d65c081a474797065b0416c6c426c6f636b73436c656172656487a474797065ab426c6f636b53746f726564"
    "ac626c6f636b5f686173686573921f20b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f6964"
    "73dc00200404040404040404040404040404040404040404040404040404040404040404aa626c6f636b5f73"
    "697a6510a76c6f72615f6964c0a66d656469756da3475055b2646174615f706172616c6c656c5f72616e6b01"
)


def test_recorded_array_batch_decodes_field_by_field() -> None:
    batch = decode_batch(ARRAY_BATCH)
    assert batch.ts == 1700000000.5
    assert batch.data_parallel_rank is None
    first = batch.events[0]
    assert isinstance(first, BlockStored)
    assert first.block_hashes == [11, 12, 2**64 - 16]
    assert first.parent_block_hash is None
    assert first.token_ids == list(range(48))
    assert first.block_size == 16 and first.medium == "GPU"
    assert batch.events[1] == BlockStored([21], 12, [1] * 16, 16, None, None)
    assert batch.events[2] == BlockRemoved([2**64 - 16], "GPU")


def test_recorded_batches_build_the_index() -> None:
    index = PreciseIndex()
    index.apply("a", decode_batch(ARRAY_BATCH), now=1.0, seq=0)
    # 11, 12 stored; 2**64-16 stored then removed; 21 chained on 12; 99 only on CPU.
    assert index.blocks_of("a") == {11, 12, 21}
    assert index.match([11, 12, 21, 5], 1.0) == {"a": 3}
    assert index.match([11, 12, 2**64 - 16], 1.0) == {"a": 2}
    assert index.match([99], 1.0) == {}
    assert index.match([12, 21], 1.0, ["b"]) == {}
    assert index.state("a").last_seq == 0

    batch = decode_batch(MAP_BATCH)
    assert batch.data_parallel_rank == 1
    assert isinstance(batch.events[1], AllBlocksCleared)
    index.apply("a", batch, now=2.0, seq=1)
    # The digest-bytes hash is read as its low 64 bits (7); the clear dropped the rest.
    assert index.blocks_of("a") == {31, 32}
    assert index.match([31, 32, 11], 2.0) == {"a": 2}


def test_index_keeps_nodes_apart_and_resyncs_one() -> None:
    index = PreciseIndex()
    index.apply("a", KVEventBatch(0.0, [BlockStored([1, 2, 3], None)]), 0.0)
    index.apply("b", KVEventBatch(0.0, [BlockStored([1, 2], None)]), 0.0)
    assert index.match([1, 2, 3], 0.0) == {"a": 3, "b": 2}
    index.apply("a", KVEventBatch(0.0, [BlockRemoved([2])]), 0.0)
    assert index.match([1, 2, 3], 0.0) == {"a": 1, "b": 2}
    assert index.resync("b") == 2
    assert not index.is_synced("b")
    assert index.match([1, 2, 3], 0.0) == {"a": 1}
    assert index.synced_nodes() == {"a"}
    assert len(index) == 2


def test_encoder_writes_the_array_layout_vllm_reads() -> None:
    batch = KVEventBatch(
        5.0,
        [
            BlockStored([1, 2], None, [7] * 32, 16, None, "GPU"),
            BlockRemoved([1]),
            AllBlocksCleared(),
        ],
        data_parallel_rank=0,
    )
    raw = msgspec.msgpack.decode(encode_batch(batch))
    assert raw == [
        5.0,
        [["BlockStored", [1, 2], None, [7] * 32, 16, None, "GPU"], ["BlockRemoved", [1], None],
         ["AllBlocksCleared"]],
        0,
    ]  # fmt: skip
    assert decode_batch(encode_batch(batch)) == batch


def test_framing_helpers_and_bad_payloads() -> None:
    assert seq_to_bytes(5) == b"\x00" * 7 + b"\x05"
    assert seq_from_bytes(END_SEQ) == -1
    assert hash_to_int(b"\x01" * 32) == int.from_bytes(b"\x01" * 8, "big")
    for bad in (
        b"\xc1",
        msgspec.msgpack.encode([1.0]),
        msgspec.msgpack.encode([1.0, [["BlockStored"]]]),
    ):
        with pytest.raises(WireError):
            decode_batch(bad)
    # Unknown event types from newer engines are skipped, not fatal.
    assert decode_batch(msgspec.msgpack.encode([1.0, [["BlockMoved", 1]]])).events == []


def test_token_ids_can_be_left_undecoded() -> None:
    fast = decode_batch(ARRAY_BATCH, token_ids=False)
    full = decode_batch(ARRAY_BATCH)
    assert [e.block_hashes for e in fast.events if isinstance(e, BlockStored)] == [
        e.block_hashes for e in full.events if isinstance(e, BlockStored)
    ]
    assert all(e.token_ids == [] for e in fast.events if isinstance(e, BlockStored))
    # Trailing fields of newer releases (lora_name, extra_keys, group_idx, …) are ignored.
    newer = msgspec.msgpack.encode(
        [2.0, [["BlockStored", [5], None, [1] * 16, 16, None, "GPU", "lora-a", [None], 0]], 0]
    )
    assert decode_batch(newer).events == [BlockStored([5], None, [1] * 16, 16, None, "GPU")]


def test_index_agrees_with_a_brute_force_model() -> None:
    import random

    rng = random.Random(11)
    index, model = PreciseIndex(), {f"n{i}": set() for i in range(4)}
    for node in model:
        index.apply(node, KVEventBatch(0.0, []), 0.0)
    universe = list(range(1, 40))
    for _ in range(600):
        node = rng.choice(list(model))
        hashes = rng.sample(universe, rng.randint(1, 6))
        kind = rng.random()
        if kind < 0.55:
            index.apply(node, KVEventBatch(0.0, [BlockStored(hashes, None)]), 0.0)
            model[node].update(hashes)
        elif kind < 0.95:
            index.apply(node, KVEventBatch(0.0, [BlockRemoved(hashes)]), 0.0)
            model[node].difference_update(hashes)
        else:
            index.apply(node, KVEventBatch(0.0, [AllBlocksCleared()]), 0.0)
            model[node].clear()
        chain = rng.sample(universe, 8)
        expected = {}
        for n, held in model.items():
            k = 0
            while k < len(chain) and chain[k] in held:
                k += 1
            if k:
                expected[n] = k
        assert index.match(chain, 0.0) == expected
        assert all(index.blocks_of(n) == held for n, held in model.items())
