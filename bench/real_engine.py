"""Real-engine benchmark: llama.cpp servers behind kvgate, routing policies compared.

For each policy: start N fresh llama-server processes (one thread each, empty caches)
and ``kvgate serve --engine-type llamacpp --policy P`` in front of them, send the same
shared-prefix workload one request at a time, and record time to first token and the
engine-reported cached tokens. The first policy listed is the baseline; the others are
reported as ratios against it, measured in the same run.

    .venv/bin/python bench/real_engine.py                 # round_robin vs hybrid
    .venv/bin/python bench/real_engine.py --prefixes 3 --per-prefix 4 --json out.json

Needs scripts/build-llama.sh to have installed llama-server and the Gemma 3 270M GGUF.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

from kvgate.loadgen.probe import Result, Summary, build_workload, run_workload, summarize
from kvgate.procs import start_gateway_process, wait_until_routable
from kvgate.procs.llama import missing_reason, start_llama_server


def run_policy(policy: str, args: argparse.Namespace) -> list[Result]:
    servers = [start_llama_server(threads=args.threads) for _ in range(args.nodes)]
    gw = None
    try:
        gw = start_gateway_process(
            backends=[s.url for s in servers],
            extra_args=["--engine-type", "llamacpp", "--policy", policy, "--scrape-interval", "1"],
        )
        wait_until_routable(gw)
        time.sleep(1.5)
        items = build_workload(
            prefixes=args.prefixes,
            per_prefix=args.per_prefix,
            prefix_tokens=args.prefix_tokens,
            seed=args.seed,
        )
        return asyncio.run(run_workload(gw.url, items, max_tokens=args.max_tokens))
    finally:
        if gw is not None:
            gw.stop()
        for s in servers:
            s.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--policies", default="round_robin,hybrid", help="first one is the baseline")
    p.add_argument("--nodes", type=int, default=2, help="llama-server processes per policy")
    p.add_argument("--threads", type=int, default=1, help="threads per llama-server")
    p.add_argument("--prefixes", type=int, default=3, help="distinct shared prefixes")
    p.add_argument("--per-prefix", type=int, default=4, help="requests per prefix")
    p.add_argument("--prefix-tokens", type=int, default=1000, help="tokens per prefix")
    p.add_argument("--max-tokens", type=int, default=4, help="output tokens per request")
    p.add_argument("--seed", type=int, default=7, help="workload seed")
    p.add_argument("--json", type=Path, default=None, help="write all results here")
    args = p.parse_args()
    reason = missing_reason()
    if reason:
        print(f"bench/real_engine.py: {reason}", file=sys.stderr)
        return 2
    policies = [s.strip() for s in args.policies.split(",") if s.strip()]
    results: dict[str, list[Result]] = {}
    summaries: dict[str, Summary] = {}
    for policy in policies:
        t0 = time.perf_counter()
        results[policy] = run_policy(policy, args)
        summaries[policy] = summarize(results[policy])
        print(f"{policy}: {summaries[policy]} ({time.perf_counter() - t0:.1f} s)", flush=True)
    base = summaries[policies[0]]
    print(f"\nmachine: {platform.machine()} {platform.node()}; nodes={args.nodes} "
          f"threads/node={args.threads}; {args.prefixes} prefixes x {args.per_prefix} requests, "
          f"~{args.prefix_tokens}-token prefixes")  # fmt: skip
    print(f"{'policy':<14}{'mean TTFT s':>12}{'median s':>10}{'cached %':>10}{'warm':>6}"
          f"{'TTFT vs ' + policies[0]:>22}")  # fmt: skip
    for policy in policies:
        s = summaries[policy]
        ratio = s.mean_ttft_s / base.mean_ttft_s if base.mean_ttft_s else float("nan")
        print(f"{policy:<14}{s.mean_ttft_s:>12.3f}{s.median_ttft_s:>10.3f}"
              f"{100 * s.cached_fraction:>9.1f}%{s.warm_requests:>4}/{s.requests:<2}{ratio:>20.2f}x")  # fmt: skip
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "summaries": {k: asdict(v) for k, v in summaries.items()},
                    "results": {k: [asdict(r) for r in v] for k, v in results.items()},
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
