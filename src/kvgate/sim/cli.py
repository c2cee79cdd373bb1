"""`kvgate sim`: every listed policy on the identical request stream, in virtual time."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from kvgate.cli import add_flag_option, add_slo_arguments, flag_overrides
from kvgate.engine.profiles import PROFILES
from kvgate.routing.policies import policy_names
from kvgate.sim.cluster import SimConfig, SimResult, run_comparison
from kvgate.sim.events import parse_event
from kvgate.sim.reference_policies import OraclePolicy, SmgApproxPolicy
from kvgate.workloads import WORKLOAD_NAMES
from kvgate.workloads.catalog import LOADS, generate_at_load


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workload",
        default="shared-prefix",
        choices=WORKLOAD_NAMES,
        help="generated request stream (docs/workloads.md)",
    )
    parser.add_argument("--nodes", type=int, default=8, help="simulated engines")
    parser.add_argument(
        "--policies",
        default="round_robin,hybrid",
        help="comma-separated routing policies, each run on the same stream; one of "
        + ", ".join(sorted(policy_names() | {OraclePolicy.name, SmgApproxPolicy.name})),
    )
    parser.add_argument(
        "--requests",
        type=int,
        default=None,
        help="requests to generate (default: the workload's own count, docs/workloads.md)",
    )
    parser.add_argument(
        "--rate", type=float, default=None, help="arrivals per second (default: the workload's own)"
    )
    parser.add_argument(
        "--load",
        choices=LOADS,
        default="normal",
        help="high: the routing workloads' saturated variant (round_robin's prefill near "
        "capacity; rate and request count from workloads/catalog.py HIGH_LOAD); "
        "--requests/--rate still override",
    )
    parser.add_argument("--seed", type=int, default=0, help="workload and simulator RNG seed")
    parser.add_argument(
        "--profile",
        default="llama3-8b-h100",
        help="engine profile of every node: " + ", ".join(sorted(PROFILES)),
    )
    parser.add_argument(
        "--kv-blocks",
        type=int,
        default=None,
        help="KV blocks per node (default: the profile's or the workload's hint)",
    )
    parser.add_argument(
        "--admission",
        choices=("on", "off"),
        default="off",
        help="global admission control (tenants from the workload; batch degrades to low priority)",
    )
    parser.add_argument(
        "--total-quota",
        type=int,
        default=None,
        help="cluster quota in runtime tokens (default: the cluster's KV capacity)",
    )
    add_slo_arguments(parser)
    parser.add_argument(
        "--event",
        action="append",
        default=[],
        help="cluster event KIND:TIME:NODE, KIND one of join, fail, flush; repeatable",
    )
    add_flag_option(parser)
    parser.add_argument(
        "--kv-event-delay",
        type=float,
        default=0.05,
        help="seconds from an engine's KV cache event to the precise index (policy precise)",
    )
    parser.add_argument("--out", type=Path, default=None, help="write JSON/CSV/MD/PNG here")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--wide",
        action="store_true",
        help="print the results as one table with every column (wider than 80 columns)",
    )


def build(args: argparse.Namespace) -> tuple[Any, SimConfig, list[str]]:
    if args.nodes < 1:
        raise ValueError("--nodes must be >= 1")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not policies:
        raise ValueError("--policies: name at least one policy")
    from kvgate.report.summary import parse_class_slos

    class_slos = parse_class_slos(args.class_slo)
    workload = generate_at_load(
        args.workload, args.load, seed=args.seed, requests=args.requests, rate=args.rate
    )
    config = SimConfig(
        nodes=args.nodes,
        profile=args.profile,
        kv_blocks=args.kv_blocks,
        admission=args.admission == "on",
        total_quota=args.total_quota,
        seed=args.seed,
        slo_ttft_s=args.ttft_slo,
        class_slos=class_slos,
        events=[parse_event(e) for e in args.event],
        flags=flag_overrides(args.flag),
        degrade_modes={"batch": "low_priority"} if args.admission == "on" else {},
        kv_event_delay_s=args.kv_event_delay,
    )
    return workload, config, policies


# The console tables at 80 columns: full column header → short header, per table.
NARROW_TABLES: tuple[tuple[str, dict[str, str]], ...] = (
    (
        "latency (s; TPOT in ms; vs base: TTFT p50)",
        {
            "TTFT p50 (s)": "TTFT p50",
            "TTFT p90 (s)": "p90",
            "TTFT p99 (s)": "p99",
            "TPOT p50 (ms)": "TPOT p50",
            "E2E p50 (s)": "E2E p50",
            "TTFT p50 vs base": "vs base",
        },
    ),
    (
        "throughput (tok/s: output tokens per second, also vs base)",
        {
            "req/s": "req/s",
            "out tok/s": "tok/s",
            "goodput tok/s": "goodput tok/s",
            "goodput req/s": "goodput req/s",
            "tok/s vs base": "vs base",
        },
    ),
    (
        "cache and balance",
        {
            "hit rate": "hit rate",
            "predicted hit": "predicted",
            "load CV": "load CV",
            "Jain": "Jain",
        },
    ),
    (
        "admission",
        {"queued": "queued", "rejected": "rejected", "degraded": "degraded", "lost": "lost"},
    ),
)


def narrow_tables(rows: list[list[str]], width: int = 80) -> str:
    """``table_rows`` output as a few aligned tables, each at most ``width`` columns wide
    (a table that would be wider continues in another); columns no table names go last."""
    head = rows[0]
    named = {full for _, columns in NARROW_TABLES for full in columns}
    tables = [(title, dict(columns)) for title, columns in NARROW_TABLES]
    tables.append(("other", {h: h for h in head[1:] if h not in named}))
    out: list[str] = []
    for title, columns in tables:
        picked = [(head.index(full), short) for full, short in columns.items() if full in head]
        while picked:
            n = len(picked)
            while n > 1 and len(_aligned(rows, picked[:n])[0]) > width:
                n -= 1
            out += ["", title, *_aligned(rows, picked[:n])]
            picked = picked[n:]
    return "\n".join(out[1:])


def _aligned(rows: list[list[str]], picked: list[tuple[int, str]]) -> list[str]:
    table = [["policy", *(short for _, short in picked)]]
    table += [[row[0], *(row[i] for i, _ in picked)] for row in rows[1:]]
    widths = [max(len(r[c]) for r in table) for c in range(len(table[0]))]
    lines = [
        "| "
        + " | ".join(
            v.rjust(w) if c else v.ljust(w) for c, (v, w) in enumerate(zip(r, widths, strict=True))
        )
        + " |"
        for r in table
    ]
    rule = "|" + "|".join("-" * (w + 1) + (":" if c else "-") for c, w in enumerate(widths)) + "|"
    return [lines[0], rule, *lines[1:]]


def results_json(results: dict[str, SimResult]) -> dict[str, dict[str, Any]]:
    return {name: {**r.summary, "cache_choice": r.cache_choice} for name, r in results.items()}


def cache_choice_line(name: str, choice: dict[str, Any]) -> str:
    """One policy's routing-decision quality, for the text output."""
    share = choice.get("took_best_share")
    took = f"{share * 100:.1f}%" if share is not None else "-"
    return (
        f"{name}: best cached node on {took} of {choice.get('decisions', 0):,} decisions,"
        f" forgone {choice.get('forgone_tokens', 0):,} of {choice.get('best_tokens', 0):,}"
        " cached tokens"
    )


def run(args: argparse.Namespace) -> int:
    try:
        workload, config, policies = build(args)
    except ValueError as exc:
        print(f"kvgate sim: {exc}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    try:
        results = run_comparison(workload, config, policies)
    except ValueError as exc:  # e.g. an unknown policy name
        print(f"kvgate sim: {exc}", file=sys.stderr)
        return 2
    wall = time.perf_counter() - started
    summaries = results_json(results)
    from kvgate.report import markdown_table, write_report
    from kvgate.report.summary import table_rows

    meta = {
        "workload": args.workload,
        "load": args.load,
        "nodes": args.nodes,
        "profile": args.profile,
        "seed": args.seed,
        "requests": len(workload.items),
        "admission": args.admission,
        "kv_blocks_per_node": next(iter(results.values())).summary.get("kv_blocks_per_node"),
        "command": "kvgate sim " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else "kvgate sim",
    }
    if args.out is not None:
        write_report(
            args.out,
            summaries,
            {n: r.records for n, r in results.items()},
            f"kvgate sim: {args.workload} on {args.nodes} nodes",
            meta=meta,
            node_load={n: r.node_load for n, r in results.items()},
            hit_rate={n: r.hit_rate for n, r in results.items()},
            quota={
                n: r.summary["quota_series"]
                for n, r in results.items()
                if "quota_series" in r.summary
            },
            baseline=policies[0],
        )
    if args.json:
        print(json.dumps({"meta": meta, "results": summaries}, indent=2, sort_keys=True))
    else:
        if args.wide:
            print(markdown_table(summaries, baseline=policies[0]))
        else:
            print(narrow_tables(table_rows(summaries, baseline=policies[0])))
        print(f"\n{len(policies)} policies x {len(workload.items)} requests in {wall:.1f} s wall")
        for name, result in results.items():
            print(cache_choice_line(name, result.cache_choice))
        for name, summary in summaries.items():  # kvgate.forecast, with admission on
            if summary.get("forecast_mape_pct") is not None:
                print(f"{name}: forecast MAPE {summary['forecast_mape_pct']:.1f}%")
        if args.out is not None:
            print(f"report: {args.out / 'report.md'}")
    lost = sum(r.summary["lost"] for r in results.values())
    if lost:
        print(f"kvgate sim: {lost} requests lost", file=sys.stderr)
        return 1
    return 0
