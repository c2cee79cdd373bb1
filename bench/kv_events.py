"""Cost of the KV-event path, in-process: what a gateway replica pays per engine event
and per request (no ZMQ; the live lag is in bench/compare_live.py's precise row).

* decode + apply: one engine's realistic batches (a few BlockStored of 1–32 blocks, with
  16 token ids each, and BlockRemoved of evicted blocks) through ``decode_batch`` and
  ``PreciseIndex.apply``, as events per second;
* request hashing: a prompt's token ids → vLLM's sha256_cbor chain (and xxhash_cbor);
* match: a request's chain against 64 synced nodes holding ~1M blocks in all, for policy
  precise, next to the approximate ``PrefixIndex.match`` in the same run (ratio).

    .venv/bin/python bench/kv_events.py [--batches 20000] [--iterations 2000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from kvgate.kv_events.hashing import TokenBlockHasher
from kvgate.kv_events.index import PreciseIndex
from kvgate.kv_events.wire import (
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
    encode_batch,
)
from kvgate.routing.prefix_index import PrefixIndex

NODES = 64
BLOCKS_PER_NODE = 16_000


def _batches(n: int, rng: random.Random) -> tuple[list[bytes], int]:
    out, events, h = [], 0, 1
    for _ in range(n):
        evs: list[BlockStored | BlockRemoved] = []
        for _ in range(rng.randint(1, 4)):
            k = rng.randint(1, 32)
            evs.append(BlockStored(list(range(h, h + k)), h - 1, [7] * (16 * k), 16, None, "GPU"))
            h += k
        if h > 1000:
            evs.append(
                BlockRemoved([rng.randrange(1, h) for _ in range(rng.randint(1, 16))], "GPU")
            )
        events += len(evs)
        out.append(encode_batch(KVEventBatch(time.time(), evs, 0)))
    return out, events


def p50_p99(samples: list[float]) -> tuple[float, float]:
    s = sorted(samples)
    return statistics.median(s), s[int(0.99 * (len(s) - 1))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=20_000)
    ap.add_argument("--iterations", type=int, default=2_000)
    args = ap.parse_args()
    rng = random.Random(0)

    payloads, n_events = _batches(args.batches, rng)
    for tokens in (False, True):
        index = PreciseIndex()
        t0 = time.perf_counter()
        for i, raw in enumerate(payloads):
            index.apply("n0", decode_batch(raw, token_ids=tokens), 0.0, i)
        dt = time.perf_counter() - t0
        what = "token ids decoded too" if tokens else "engine hashes only"
        print(f"decode+apply, {what}: {len(payloads) / dt:,.0f} batches/s, "
              f"{n_events / dt:,.0f} events/s ({dt / len(payloads) * 1e6:.1f} us per batch)")  # fmt: skip

    for algo in ("sha256_cbor", "xxhash_cbor"):
        hasher = TokenBlockHasher(16, algo)
        ids = [rng.randrange(128_000) for _ in range(8192)]
        samples = []
        for _ in range(max(20, args.iterations // 50)):
            t = time.perf_counter()
            hasher.hashes(ids)
            samples.append(time.perf_counter() - t)
        p50, p99 = p50_p99(samples)
        print(f"hash 8192-token prompt ({algo}): p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms")

    precise, approx = PreciseIndex(), PrefixIndex(max_entries=NODES * BLOCKS_PER_NODE + 1)
    chain = list(range(10**9, 10**9 + 512))  # an 8k-token prompt
    for n in range(NODES):
        node = f"n{n}"
        held = [10**10 + n * BLOCKS_PER_NODE + i for i in range(BLOCKS_PER_NODE - 512)]
        depth = rng.choice((0, 0, 0, 64, 256, 512))
        held += chain[:depth]
        precise.apply(node, KVEventBatch(0.0, [BlockStored(held, None)]), 0.0)
        approx.record(node, held, 0.0)
    nodes = [f"n{n}" for n in range(NODES)]
    results = {}
    for name, idx in (("precise", precise), ("approximate", approx)):
        samples = []
        for _ in range(args.iterations):
            t = time.perf_counter()
            idx.match(chain, 0.0, nodes)
            samples.append(time.perf_counter() - t)
        results[name] = p50_p99(samples)
    for name, (p50, p99) in results.items():
        print(
            f"match 512 blocks x {NODES} nodes ({name}): p50 {p50 * 1e6:.0f} us, p99 {p99 * 1e6:.0f} us"
        )
    ratio = results["precise"][0] / results["approximate"][0]
    print(f"precise / approximate match p50: {ratio:.2f}x  ({len(precise):,} blocks indexed)")


if __name__ == "__main__":
    main()
