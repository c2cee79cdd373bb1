"""Cost of one routing decision at scale (in-process, no HTTP).

64 nodes, prefix index pre-filled with ~1M (block, node) entries, an 8k-token prompt
(512 blocks) whose prefix is cached at different depths on a few nodes. The node reports
carry a KV capacity, as the vLLM, SGLang and engine-sim adapters' do, so hybrid's eviction
guess runs (``--kv-capacity-tokens 0``: reports without one). Reports p50/p99
of ``Router.route`` for hybrid and for round_robin in the same run (ratio), the cost of
``build_route_request`` (render + tokenize + chained hashes) and of the bookkeeping
``on_dispatch`` + ``on_complete`` (which records 512 blocks in the index).

    .venv/bin/python bench/routing_decision.py [--entries 1000000] [--iterations 5000]
"""

from __future__ import annotations

import argparse
import gc
import random
import resource
import statistics
import sys
import time
from collections.abc import Callable

from kvgate.clock import ManualClock
from kvgate.flags import Flags
from kvgate.routing import NodeView, Router, RoutingConfig, build_route_request
from kvgate.tokens import BLOCK_SIZE, synthetic_text
from kvgate.types import NodeReport, NodeSpec, RouteRequest

NODES = 64
PROMPT_TOKENS = 8192


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(0.99 * (len(ordered) - 1))]


def timed(fn: Callable[[], object], iterations: int) -> list[float]:
    out: list[float] = []
    clock = time.perf_counter_ns
    for _ in range(iterations):
        t0 = clock()
        fn()
        out.append((clock() - t0) / 1000.0)  # µs
    return out


def build_router(
    policy: str, entries: int, rng: random.Random, *, warm: bool = True, kv_capacity: int = 0
) -> tuple[Router, ManualClock]:
    """``warm``: every node is past its cold-boost window (the steady state)."""
    clock = ManualClock(0.0)
    config = RoutingConfig(policy=policy, index_max_entries=entries + 10_000)
    nodes = NodeView(clock, config)
    for i in range(NODES):
        nodes.add_node(NodeSpec(f"node{i:02d}", f"http://10.0.0.{i}:8000"))
    router = Router(config, nodes, flags=Flags(), clock=clock, rng=rng)
    if warm:
        clock.set(config.warmup_s)
    for i in range(NODES):
        nodes.apply_report(
            NodeReport(
                node_id=f"node{i:02d}",
                timestamp=clock.now(),
                running=rng.randint(2, 4),
                waiting=0,
                kv_usage=0.2 + rng.random() * 0.1,
                kv_capacity_tokens=kv_capacity or None,
            )
        )
    # Fill the index with unrelated prompts: 512 blocks each, spread over all nodes.
    blocks_per_prompt = PROMPT_TOKENS // BLOCK_SIZE
    for p in range(entries // blocks_per_prompt):
        base = rng.getrandbits(63)
        router.index.record(
            f"node{p % NODES:02d}", [base + b for b in range(blocks_per_prompt)], now=clock.now()
        )
    return router, clock


def make_request(rng: random.Random) -> tuple[dict[str, object], RouteRequest]:
    system = synthetic_text(6000, random.Random(1))
    body = {
        "model": "m",
        "max_tokens": 128,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": synthetic_text(2150, rng)},
        ],
    }
    return body, route_request(body, "bench")


def route_request(body: dict[str, object], request_id: str) -> RouteRequest:
    return build_route_request(
        body,
        endpoint="chat",
        headers={},
        request_id=request_id,
        tenant="t",
        priority=0,
        config=RoutingConfig().route_key,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--iterations", type=int, default=5000)
    parser.add_argument(
        "--kv-capacity-tokens",
        type=int,
        default=262_144,
        help="KV capacity in each node report (0: none, which turns the eviction guess off)",
    )
    args = parser.parse_args()
    rng = random.Random(42)
    body, req = make_request(rng)
    print(f"prompt: {req.prompt_tokens} tokens, {len(req.block_hashes)} blocks; nodes: {NODES}")

    results: dict[str, tuple[float, float]] = {}
    for policy in ("hybrid", "round_robin", "hybrid(cold)"):
        t0 = time.perf_counter()
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        cold = policy.endswith("(cold)")
        router, clock = build_router(
            policy.removesuffix("(cold)"),
            args.entries,
            random.Random(7),
            warm=not cold,
            kv_capacity=args.kv_capacity_tokens,
        )
        # the request's own prefix is cached at several depths on a few nodes
        for depth, node in ((400, "node03"), (375, "node17"), (120, "node40"), (512, "node55")):
            router.index.record(node, req.block_hashes[:depth], now=clock.now())
        fill_s = time.perf_counter() - t0
        if policy == "hybrid":
            grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
            print(f"index memory: +{grown:.0f} MiB peak RSS for {len(router.index):,} entries")
        gc.collect()  # one full pass after the bulk fill, as a long-running gateway has had
        clock.advance(1.0)
        decision = router.route(req)
        samples = timed(lambda r=router: r.route(req), args.iterations)
        results[policy] = percentiles(samples)
        p50, p99 = results[policy]
        print(
            f"route[{policy:12s}] p50={p50:7.1f} µs  p99={p99:7.1f} µs  "
            f"(index {len(router.index):,} entries, filled in {fill_s:.1f} s; "
            f"decision {decision.node_id}/{decision.reason}/{decision.expected_cached_tokens})"
        )
        if policy == "hybrid":

            def cycle(r: Router = router) -> None:
                d = r.route(req)
                r.on_dispatch(req, d)
                r.on_complete(req, d, ok=True, actual_cached_tokens=d.expected_cached_tokens)

            bp50, bp99 = percentiles(timed(cycle, min(args.iterations, 2000)))
            print(f"route+dispatch+complete[hybrid] p50={bp50:7.1f} µs  p99={bp99:7.1f} µs")
    ratio = results["hybrid"][0] / results["round_robin"][0]
    print(f"hybrid / round_robin p50 ratio: {ratio:.2f}")

    def build() -> None:
        route_request(body, "b")

    bp50, bp99 = percentiles(timed(build, max(50, args.iterations // 20)))
    print(f"build_route_request (8k tokens) p50={bp50:7.1f} µs  p99={bp99:7.1f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
