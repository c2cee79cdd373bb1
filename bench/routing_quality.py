"""Routing quality matrix: policies × routing workloads × load levels × seeds, in `kvgate sim`.

For each workload, normal and ``--load high``, seeds 0..n−1, it runs every policy on the
identical request stream (``run_comparison``) and reports token hit rate, TTFT p50/p90,
output tokens/s and load CV — the mean over seeds and the per-seed values — then checks
issue 16's targets on every (workload, load, seed):

- hybrid ≥ smg-approx on hit rate and TTFT p90 (≤), with load CV ≤ smg-approx's;
- oracle has the lowest TTFT p90 (within 1%);
- tenant-prefix high: hybrid TTFT p90 ≤ 1/20 of round_robin's;
- shared-prefix high: hybrid output tok/s ≥ 1.5× round_robin.

Each missed check also prints how large a difference the cell's own sampling noise
makes: the 95% interval of the same difference over ``BOOTSTRAP`` paired bootstrap
resamples of the cell's requests (every policy saw the identical requests, so a
resample takes the same requests from each). An interval that holds the target's
threshold means the miss is smaller than what resampling the same workload moves.

    .venv/bin/python bench/routing_quality.py [--requests 800] [--seeds 0,1,2] \
        [--workloads shared-prefix,...] [--loads normal,high] [--jobs 1] [--out FILE.md] \
        [--cells FILE.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from kvgate.engine.profiles import get_profile
from kvgate.report.records import RequestRecord
from kvgate.report.summary import percentile
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
BOOTSTRAP = 200  # paired resamples per cell for the noise intervals


def _per_request(records: list[RequestRecord]) -> dict[str, tuple[float, int, int, str]]:
    return {
        r.request_id: (r.ttft, r.prompt_tokens, r.cached_tokens, r.node or "")
        for r in records
        if r.status == "ok" and r.ttft is not None
    }


def _stats(rows: list[tuple[float, int, int, str]], nodes: list[str]) -> tuple[float, float, float]:
    """(hit rate, TTFT p90, load CV) of a sample of requests, as the summary computes them."""
    prompt = sum(r[1] for r in rows)
    counts = dict.fromkeys(nodes, 0)
    for r in rows:
        counts[r[3]] = counts.get(r[3], 0) + 1
    vals = list(counts.values())
    mean = statistics.fmean(vals)
    cv = statistics.pstdev(vals) / mean if mean else 0.0
    p90 = percentile([r[0] for r in rows], 90) or 0.0
    return (sum(r[2] for r in rows) / prompt if prompt else 0.0, p90, cv)


def paired_noise(
    per_policy: dict[str, list[RequestRecord]], nodes: list[str], seed: int
) -> dict[str, dict[str, list[float]]]:
    """95% intervals, over paired bootstrap resamples of the requests, of hybrid − smg-approx
    (hit rate, TTFT p90, load CV) and of the oracle's TTFT p90 over the best other's − 1."""
    rows = {p: _per_request(recs) for p, recs in per_policy.items()}
    if not rows:
        return {}
    ids = sorted(set.intersection(*(set(r) for r in rows.values())))
    if not ids:
        return {}
    rng = random.Random(seed)
    diffs: dict[str, list[list[float]]] = {"hybrid-smg": [[], [], []], "oracle/best-1": [[]]}
    for _ in range(BOOTSTRAP):
        sample = [ids[rng.randrange(len(ids))] for _ in ids]
        stats = {p: _stats([r[i] for i in sample], nodes) for p, r in rows.items()}
        if "hybrid" in stats and "smg-approx" in stats:
            for k in range(3):
                diffs["hybrid-smg"][k].append(stats["hybrid"][k] - stats["smg-approx"][k])
        if "oracle" in stats and len(stats) > 1:
            best = min(v[1] for p, v in stats.items() if p != "oracle")
            diffs["oracle/best-1"][0].append(stats["oracle"][1] / best - 1.0)
    out: dict[str, dict[str, list[float]]] = {}
    names = {"hybrid-smg": ("hit", "p90", "cv"), "oracle/best-1": ("p90",)}
    for pair, series in diffs.items():
        for name, values in zip(names[pair], series, strict=True):
            if values:
                values.sort()
                lo = values[int(0.025 * (len(values) - 1))]
                hi = values[int(0.975 * (len(values) - 1))]
                out.setdefault(pair, {})[name] = [lo, hi]
    return out


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
    wall = time.perf_counter() - started
    node_ids = sorted({n for r in results.values() for n in r.summary["node_requests"]})
    noise = paired_noise({p: list(r.records) for p, r in results.items()}, node_ids, seed)
    return {
        "workload": workload,
        "load": load,
        "seed": seed,
        "wall_s": wall,
        "results": {p: {key: r.summary[key] for _, key, _ in METRICS} for p, r in results.items()},
        "noise": noise,
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
        have.pop("noise", None)  # measured on another run's policies: no longer paired


def _only(cell: dict[str, Any], policies: tuple[str, ...]) -> dict[str, Any]:
    return {**cell, "results": {p: v for p, v in cell["results"].items() if p in policies}}


def checks(cell: dict[str, Any]) -> list[str]:
    """Targets missed in one (workload, load, seed) cell, as readable lines."""
    r = cell["results"]
    where = f"{cell['workload']} {cell['load']} seed {cell['seed']}"
    out: list[str] = []
    noise = cell.get("noise") or {}

    def ci(pair: str, metric: str, scale: float, fmt: str) -> str:
        got = noise.get(pair, {}).get(metric)
        if not got:
            return ""
        lo, hi = (fmt.format(v * scale) for v in got)
        return f"; resampled 95%: [{lo}, {hi}]"

    h, s = r.get("hybrid"), r.get("smg-approx")
    if h and s:
        if h["cache_hit_rate"] < s["cache_hit_rate"]:
            out.append(
                f"{where}: hybrid hit {h['cache_hit_rate']:.2%} < smg {s['cache_hit_rate']:.2%}"
                + ci("hybrid-smg", "hit", 100, "{:+.3f} pt")
            )
        if h["ttft_p90_s"] > s["ttft_p90_s"]:
            out.append(
                f"{where}: hybrid p90 {h['ttft_p90_s']:.4f} > smg {s['ttft_p90_s']:.4f}"
                + ci("hybrid-smg", "p90", 1000, "{:+.1f} ms")
            )
        if h["node_load_cv"] > s["node_load_cv"]:
            out.append(
                f"{where}: hybrid CV {h['node_load_cv']:.3f} > smg {s['node_load_cv']:.3f}"
                + ci("hybrid-smg", "cv", 1, "{:+.3f}")
            )
    if "oracle" in r:
        best = min(v["ttft_p90_s"] for v in r.values())
        if r["oracle"]["ttft_p90_s"] > best * (1 + NOISE):
            who = min(r, key=lambda p: r[p]["ttft_p90_s"])
            out.append(
                f"{where}: oracle p90 {r['oracle']['ttft_p90_s']:.4f} > {who} {best:.4f} (+1%)"
                + ci("oracle/best-1", "p90", 100, "{:+.1f}%")
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


def seed_mean(cells: list[dict[str, Any]], workload: str, load: str) -> dict[str, Any] | None:
    """One (workload, load)'s cell with each policy's metrics averaged over its seeds."""
    mine = [c for c in cells if c["workload"] == workload and c["load"] == load]
    if not mine:
        return None
    policies = set.intersection(*(set(c["results"]) for c in mine))
    results = {
        p: {key: statistics.fmean(c["results"][p][key] for c in mine) for _, key, _ in METRICS}
        for p in policies
    }
    return {"workload": workload, "load": load, "seed": "mean", "results": results}


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
    if len(seeds) > 1:
        means = [seed_mean(cells, w, load) for load in loads for w in workloads]
        missed = [line for c in means if c is not None for line in checks(c)]
        parts += ["", "On the means over seeds: " + (str(len(missed)) if missed else "none")]
        parts += [f"- {line}" for line in missed]
    text = "\n".join(parts)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
