"""`kvgate sim`: every listed policy on the identical request stream."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kvgate.report.metrics import compute_metrics, markdown_table, write_reports
from kvgate.sim.cluster import EVENT_KINDS, simulate
from kvgate.workloads import WORKLOAD_NAMES, generate_workload


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", default="shared-prefix", choices=WORKLOAD_NAMES)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--policies", default="round_robin,hybrid")
    parser.add_argument("--requests", type=int, default=None)
    parser.add_argument("--rate", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", default="llama3-8b-h100")
    parser.add_argument("--kv-blocks", type=int, default=None)
    parser.add_argument("--ttft-slo", type=float, default=2.0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--json", action="store_true", help="print the JSON summary")
    parser.add_argument(
        "--event",
        action="append",
        default=[],
        metavar="KIND@T[:NODE]",
        help="join@30, fail@60:node-2, flush@90:node-0 (virtual seconds; repeatable)",
    )


def parse_event(text: str) -> tuple[float, str, str]:
    kind, sep, rest = text.partition("@")
    when, _, node = rest.partition(":")
    try:
        t = float(when)
    except ValueError:
        t = -1.0
    if not sep or t < 0 or kind not in EVENT_KINDS or (kind != "join" and not node):
        raise ValueError(
            f"--event {text!r}: expected KIND@SECONDS[:NODE] with KIND one of "
            f"{', '.join(EVENT_KINDS)} (NODE required for fail/flush)"
        )
    return (t, kind, node)


def run_comparison(args: argparse.Namespace) -> dict[str, Any]:
    workload = generate_workload(
        args.workload, seed=args.seed, requests=args.requests, rate=args.rate
    )
    events = [parse_event(e) for e in args.event]
    rows = []
    for policy in [p.strip() for p in args.policies.split(",") if p.strip()]:
        result = simulate(
            workload,
            policy,
            nodes=args.nodes,
            profile=args.profile,
            seed=args.seed,
            kv_blocks=args.kv_blocks,
            events=events,
        )
        rows.append(compute_metrics(result, ttft_slo_s=args.ttft_slo))
    return {
        "workload": args.workload,
        "params": {k: v for k, v in workload.params.items() if isinstance(v, int | float | str)},
        "seed": args.seed,
        "nodes": args.nodes,
        "profile": args.profile,
        "events": [list(e) for e in events],
        "policies": rows,
    }


def run(args: argparse.Namespace) -> int:
    if args.nodes < 1:
        print("--nodes must be >= 1", file=sys.stderr)
        return 2
    try:
        summary = run_comparison(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.out is not None:
        write_reports(args.out, summary)
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
    else:
        print(markdown_table(summary["policies"]))
    lost = sum(r["lost"] for r in summary["policies"])
    return 1 if lost else 0
