"""The KV cache event wire format vLLM (and SGLang) publish with ``--kv-events-config``.

Transport (ZMQ):

* PUB socket, one multipart message per batch: ``[topic, seq, payload]`` where ``seq`` is
  an 8-byte big-endian counter starting at 0 for each publisher process.
* ROUTER replay socket: a DEALER sends ``[b"", start_seq]`` (8-byte big-endian) and gets
  back ``[b"", seq, payload]`` for every buffered batch with ``seq >= start_seq``, then an
  end marker ``[b"", -1 (8-byte big-endian, signed), b""]``.

Payload (msgpack, as msgspec encodes tagged structs):

* batch ``[ts, events]`` or ``[ts, events, data_parallel_rank]`` (trailing defaults are
  omitted), or the map form ``{"ts":…, "events":…, "data_parallel_rank":…}`` used by
  newer vLLM releases that dropped ``array_like``;
* an event is an array whose first item is its tag — ``["BlockStored", block_hashes,
  parent_block_hash, token_ids, block_size, lora_id, medium, …]``, ``["BlockRemoved",
  block_hashes, medium, …]``, ``["AllBlocksCleared"]`` — or the map form
  ``{"type": "BlockStored", …}``.

Block hashes arrive as 64-bit ints (vLLM's default ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``:
the low 64 bits of the digest, read big-endian) or as raw digest bytes; both decode to the
same int (see ``hash_to_int``). Fields added by later releases are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

END_SEQ = (-1).to_bytes(8, "big", signed=True)
_MASK64 = (1 << 64) - 1


class WireError(ValueError):
    """A payload that is not a KV event batch."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int] = field(default_factory=list)
    block_size: int = 16
    lora_id: int | None = None
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: list[int]
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class KVEventBatch:
    ts: float
    events: list[KVEvent]
    data_parallel_rank: int | None = None


def hash_to_int(value: Any) -> int:
    """An external block hash (int or digest bytes) as the int the index keys on."""
    if isinstance(value, bool):
        raise WireError("a block hash cannot be a boolean")
    if isinstance(value, int):
        return value & _MASK64
    if isinstance(value, (bytes, bytearray, memoryview)):
        return int.from_bytes(bytes(value), "big") & _MASK64
    raise WireError(f"a block hash must be an int or bytes, got {type(value).__name__}")


def seq_to_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big", signed=seq < 0)


def seq_from_bytes(raw: bytes) -> int:
    if len(raw) != 8:
        raise WireError(f"a sequence number has 8 bytes, got {len(raw)}")
    return int.from_bytes(raw, "big", signed=True)


# -- encoding (what engine-sim publishes): msgspec tagged, array-like structs ------------


class _Event(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class _Stored(_Event, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class _Removed(_Event, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class _Cleared(_Event, tag="AllBlocksCleared"):
    pass


class _Batch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[_Stored | _Removed | _Cleared]
    data_parallel_rank: int | None = None


_encoder = msgspec.msgpack.Encoder()


def _wire_event(ev: KVEvent) -> _Stored | _Removed | _Cleared:
    if isinstance(ev, BlockStored):
        return _Stored(
            ev.block_hashes, ev.parent_block_hash, ev.token_ids, ev.block_size, ev.lora_id,
            ev.medium,
        )  # fmt: skip
    if isinstance(ev, BlockRemoved):
        return _Removed(ev.block_hashes, ev.medium)
    return _Cleared()


def encode_batch(batch: KVEventBatch) -> bytes:
    wire = _Batch(batch.ts, [_wire_event(e) for e in batch.events], batch.data_parallel_rank)
    return _encoder.encode(wire)


# -- decoding (what the gateway reads): tolerant of both struct layouts -----------------

_decoder = msgspec.msgpack.Decoder()


def _opt_int(value: Any) -> int | None:
    return None if value is None else hash_to_int(value)


def _hashes(value: Any) -> list[int]:
    if not isinstance(value, list):
        raise WireError("block_hashes must be a list")
    return [hash_to_int(h) for h in value]


def _decode_event(raw: Any) -> KVEvent | None:
    """One event; None for an event type this gateway does not know (skipped)."""
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        tag, fields = raw[0], raw[1:]
        if tag == "BlockStored":
            if len(fields) < 2:
                raise WireError("BlockStored needs block_hashes and parent_block_hash")
            tokens = fields[2] if len(fields) > 2 and isinstance(fields[2], list) else []
            size = fields[3] if len(fields) > 3 and isinstance(fields[3], int) else 0
            lora = fields[4] if len(fields) > 4 else None
            medium = fields[5] if len(fields) > 5 else None
            return BlockStored(_hashes(fields[0]), _opt_int(fields[1]), tokens, size, lora, medium)
        if tag == "BlockRemoved":
            if not fields:
                raise WireError("BlockRemoved needs block_hashes")
            return BlockRemoved(_hashes(fields[0]), fields[1] if len(fields) > 1 else None)
        if tag == "AllBlocksCleared":
            return AllBlocksCleared()
        return None
    if isinstance(raw, dict):
        kind = raw.get("type")
        if kind == "BlockStored":
            return BlockStored(
                _hashes(raw.get("block_hashes")),
                _opt_int(raw.get("parent_block_hash")),
                list(raw.get("token_ids") or []),
                int(raw.get("block_size") or 0),
                raw.get("lora_id"),
                raw.get("medium"),
            )
        if kind == "BlockRemoved":
            return BlockRemoved(_hashes(raw.get("block_hashes")), raw.get("medium"))
        if kind == "AllBlocksCleared":
            return AllBlocksCleared()
        if isinstance(kind, str):
            return None
    raise WireError("an event must be a tagged array or a tagged map")


# Typed fast path for the array layout: msgspec checks the shape in C and leaves each
# event's token ids undecoded (``Raw``) unless asked for. Trailing fields added by newer
# releases are ignored; anything else (map layout, unknown event types) takes the
# tolerant generic path below.

_Hash = int | bytes


class _InEvent(msgspec.Struct, array_like=True, gc=False, tag=True):
    pass


class _InStored(_InEvent, tag="BlockStored"):
    block_hashes: list[_Hash]
    parent_block_hash: _Hash | None
    token_ids: msgspec.Raw = msgspec.Raw(b"\x90")
    block_size: int = 0
    lora_id: int | None = None
    medium: str | None = None


class _InRemoved(_InEvent, tag="BlockRemoved"):
    block_hashes: list[_Hash]
    medium: str | None = None


class _InCleared(_InEvent, tag="AllBlocksCleared"):
    pass


class _InBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[_InStored | _InRemoved | _InCleared]
    data_parallel_rank: int | None = None


_typed = msgspec.msgpack.Decoder(_InBatch)
_token_list = msgspec.msgpack.Decoder(list[int])


def _fast(batch: _InBatch, token_ids: bool) -> KVEventBatch:
    events: list[KVEvent] = []
    for ev in batch.events:
        if isinstance(ev, _InStored):
            tokens = _token_list.decode(ev.token_ids) if token_ids else []
            parent = ev.parent_block_hash
            events.append(
                BlockStored(
                    [h & _MASK64 if type(h) is int else hash_to_int(h) for h in ev.block_hashes],
                    None if parent is None else hash_to_int(parent),
                    tokens,
                    ev.block_size,
                    ev.lora_id,
                    ev.medium,
                )
            )
        elif isinstance(ev, _InRemoved):
            events.append(BlockRemoved([hash_to_int(h) for h in ev.block_hashes], ev.medium))
        else:
            events.append(AllBlocksCleared())
    return KVEventBatch(batch.ts, events, batch.data_parallel_rank)


def decode_batch(payload: bytes, *, token_ids: bool = True) -> KVEventBatch:
    """One batch; ``token_ids=False`` skips decoding the blocks' token ids (a gateway that
    indexes the engine's own hashes never reads them)."""
    try:
        return _fast(_typed.decode(payload), token_ids)
    except (msgspec.ValidationError, msgspec.DecodeError):
        pass  # the map layout, an unknown event type, or not a batch at all
    try:
        raw = _decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise WireError(f"not msgpack: {exc}") from None
    if isinstance(raw, list) and len(raw) >= 2:
        ts, events, rank = raw[0], raw[1], (raw[2] if len(raw) > 2 else None)
    elif isinstance(raw, dict) and "events" in raw:
        ts, events, rank = raw.get("ts", 0.0), raw["events"], raw.get("data_parallel_rank")
    else:
        raise WireError("a batch is [ts, events, (data_parallel_rank)]")
    if not isinstance(ts, (int, float)) or not isinstance(events, list):
        raise WireError("a batch is [ts: float, events: list, ...]")
    decoded = [e for e in (_decode_event(r) for r in events) if e is not None]
    return KVEventBatch(float(ts), decoded, rank if isinstance(rank, int) else None)
