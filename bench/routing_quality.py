"""Routing quality matrix: policies × routing workloads × load levels × seeds, in `kvgate sim`.

For each workload, normal and ``--load high``, seeds 0..n−1, it runs every policy on the
identical request stream (``run_comparison``) and reports token hit rate, TTFT p50/p90,
output tokens/s and load CV — the mean over seeds and the per-seed values — then checks
issue 16's targets on every (workload, load, seed):

- hybrid ≥ smg-approx on hit rate and TTFT p90 (≤), with load CV ≤ smg-approx's;
- oracle has the lowest TTFT p90 (within 1%);
- tenant-prefix high: hybrid TTFT p90 ≤ 1/20 of round_robin's;
- shared-prefix high: hybrid output tok/s ≥ 1.5× round_robin.

    .venv/bin/python bench/routing_quality.py [--requests 800] [--seeds 0,1,2] \
        [--workloads shared-prefix,...] [--loads normal,high] [--jobs 1] [--out FILE.md] \
        [--cells FILE.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from kvgate.engine.profiles import get_profile
from kvgate.sim.cluster import SimConfig, run_comparison
from kvgate.workloads.catalog import generate_at_load

ROUTING_WORKLOADS = ("shared-prefix", "tenant-prefix", "multi-turn", "tool-agent", "hot-prefix")
POLICIES = ("round_robin", "smg-approx", "hybrid", "oracle")
METRICS = (
    ("hit rate", "cache_hit_rate", "{:.1%}"),
    ("TTFT p50 (s)", "ttft_p50_s", "{:.3f}"),
    ("TTFT p90 (s)", "ttft_p90_s", "{:.3f}"),
    ("out tok/s", "output_tokens_per_s", "{:.0f}"),
    ("load CV", "node_load_cv", "{:.2f}"),
    ("prefill util", "prefill_util", "{:.0%}"),
)
PROFILE = "llama3-8b-h100"
NOISE = 0.01  # the oracle's TTFT p90 may exceed the best by this fraction


def run_cell(args: tuple[str, str, int, int | None, int, tuple[str, ...]]) -> dict[str, Any]:
    workload, load, seed, requests, nodes, policies = args
    wl = generate_at_load(workload, load, seed=seed, requests=requests)
    started = time.perf_counter()
    results = run_comparison(wl, SimConfig(nodes=nodes, seed=seed, profile=PROFILE), list(policies))
    # offered prefill: the prompt tokens a policy left uncached, as a fraction of what the
    # cluster can prefill while the requests arrive (compute-bound prefill rate)
    spc = get_profile(PROFILE).seconds_per_compute_token
    span = max(1e-9, wl.items[-1].arrival - wl.items[0].arrival)
    for r in results.values():
        uncached = sum(x.prompt_tokens - x.cached_tokens for x in r.records)
        r.summary["prefill_util"] = uncached * spc / (nodes * span)
    return {
        "workload": workload,
        "load": load,
        "seed": seed,
        "wall_s": time.perf_counter() - started,
        "results": {p: {key: r.summary[key] for _, key, _ in METRICS} for p, r in results.items()},
    }


def _merge(into: dict[tuple[str, str, int], dict[str, Any]], cell: dict[str, Any]) -> None:
    """Add one cell's policies to the cell of the same (workload, load, seed)."""
    key = (cell["workload"], cell["load"], cell["seed"])
    have = into.get(key)
    if have is None:
        into[key] = {**cell, "results": dict(cell["results"])}
    else:
        have["results"].update(cell["results"])
        have["wall_s"] += cell["wall_s"]


def _only(cell: dict[str, Any], policies: tuple[str, ...]) -> dict[str, Any]:
    return {**cell, "results": {p: v for p, v in cell["results"].items() if p in policies}}


def checks(cell: dict[str, Any]) -> list[str]:
    """Targets missed in one (workload, load, seed) cell, as readable lines."""
    r = cell["results"]
    where = f"{cell['workload']} {cell['load']} seed {cell['seed']}"
    out: list[str] = []
    h, s = r.get("hybrid"), r.get("smg-approx")
    if h and s:
        if h["cache_hit_rate"] < s["cache_hit_rate"]:
            out.append(
                f"{where}: hybrid hit {h['cache_hit_rate']:.2%} < smg {s['cache_hit_rate']:.2%}"
            )
        if h["ttft_p90_s"] > s["ttft_p90_s"]:
            out.append(f"{where}: hybrid p90 {h['ttft_p90_s']:.4f} > smg {s['ttft_p90_s']:.4f}")
        if h["node_load_cv"] > s["node_load_cv"]:
            out.append(f"{where}: hybrid CV {h['node_load_cv']:.2f} > smg {s['node_load_cv']:.2f}")
    if "oracle" in r:
        best = min(v["ttft_p90_s"] for v in r.values())
        if r["oracle"]["ttft_p90_s"] > best * (1 + NOISE):
            who = min(r, key=lambda p: r[p]["ttft_p90_s"])
            out.append(
                f"{where}: oracle p90 {r['oracle']['ttft_p90_s']:.4f} > {who} {best:.4f} (+1%)"
            )
    rr = r.get("round_robin")
    if h and rr and cell["load"] == "high":
        if cell["workload"] == "tenant-prefix" and h["ttft_p90_s"] * 20 > rr["ttft_p90_s"]:
            out.append(
                f"{where}: hybrid p90 {h['ttft_p90_s']:.3f} > rr/20 {rr['ttft_p90_s'] / 20:.3f}"
            )
        ratio = h["output_tokens_per_s"] / rr["output_tokens_per_s"]
        if cell["workload"] == "shared-prefix" and ratio < 1.5:
            out.append(f"{where}: hybrid tok/s only {ratio:.2f}x round_robin")
    return out


def table(workload: str, cells: list[dict[str, Any]], policies: tuple[str, ...]) -> str:
    head = "| load | policy | " + " | ".join(name for name, _, _ in METRICS) + " |"
    lines = [head, "|" + "---|" * (len(METRICS) + 2)]
    for load in ("normal", "high"):
        mine = [c for c in cells if c["workload"] == workload and c["load"] == load]
        if not mine:
            continue
        for p in policies:
            vals = []
            for _, key, fmt in METRICS:
                per_seed = [c["results"][p][key] for c in mine]
                mean = fmt.format(statistics.fmean(per_seed))
                seeds = " / ".join(fmt.format(v) for v in per_seed)
                vals.append(f"{mean} ({seeds})" if len(per_seed) > 1 else mean)
            lines.append(f"| {load} | {p} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--requests", type=int, default=None, help="default: the workload's (high: its HIGH_LOAD)"
    )
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--workloads", default=",".join(ROUTING_WORKLOADS))
    parser.add_argument("--loads", default="normal,high")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--jobs", type=int, default=1, help="processes (the machine is shared)")
    parser.add_argument("--out", default=None, help="write the markdown tables here")
    parser.add_argument(
        "--cells",
        default=None,
        help="JSON-lines file: each finished cell is appended; a policy whose cell is "
        "already there is not rerun (resume an interrupted run, or measure policies in "
        "separate runs into one file; tables come from the file)",
    )
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    workloads = [w for w in args.workloads.split(",") if w]
    loads = [x for x in args.loads.split(",") if x]
    policies = tuple(p for p in args.policies.split(",") if p)
    keys = [(w, load, seed) for load in loads for w in workloads for seed in seeds]
    # cells already in the file, merged per (workload, load, seed): a policy measured in
    # an earlier run (e.g. ``--policies oracle``) is not rerun
    merged: dict[tuple[str, str, int], dict[str, Any]] = {}
    if args.cells and os.path.exists(args.cells):
        with open(args.cells) as fh:
            for line in fh:
                if line.strip():
                    _merge(merged, json.loads(line))
    todo = []
    for key in keys:
        have = merged[key]["results"] if key in merged else {}
        missing = tuple(p for p in policies if p not in have)
        if missing:
            todo.append((*key, args.requests, args.nodes, missing))
    started = time.perf_counter()

    def keep(cell: dict[str, Any]) -> None:
        _merge(merged, cell)
        if args.cells:
            with open(args.cells, "a") as fh:
                fh.write(json.dumps(cell, sort_keys=True) + "\n")

    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            for cell in pool.map(run_cell, todo):
                keep(cell)
    else:
        for j in todo:
            keep(run_cell(j))
    wall = time.perf_counter() - started
    cells = [_only(merged[k], policies) for k in keys if k in merged]
    command = "python bench/routing_quality.py " + " ".join(sys.argv[1:])
    parts = [f"`{command}` — {len(cells)} cells in {wall:.0f} s wall", ""]
    for w in workloads:
        parts += [f"#### {w}", "", table(w, cells, policies), ""]
    missed = [line for c in cells for line in checks(c)]
    parts.append("Targets missed: " + (str(len(missed)) if missed else "none"))
    parts += [f"- {line}" for line in missed]
    text = "\n".join(parts)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
