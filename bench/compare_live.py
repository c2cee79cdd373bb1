"""Routing policies compared live: engine-sim processes + ``kvgate serve`` + ``kvgate bench``.

For each policy: start N fresh simulated engines (one ``kvgate engine-sim --count N``
process, so every policy starts with empty caches), start ``kvgate serve --policy P`` in
front of them, run the same workload with the live load generator, stop both. Then write
one comparison in the simulator's report format (the first policy is the baseline).
Optionally (``--with-sim``) the virtual-time simulator runs the same workload for each
policy too and its hit rate is put next to the live one.

Open-loop arrivals are the workload's own, in engine seconds, divided by the engines'
``--time-scale`` (or rescaled to ``--rate`` requests per wall second); latencies in the
report are wall seconds.

    .venv/bin/python bench/compare_live.py --workload shared-prefix --engines 4 \
        --policies round_robin,hybrid --requests 200 --param groups=8 --out /tmp/live

A saturated run takes the routing workload's ``--load high`` variant (the simulator's
parameters, workloads/catalog.py HIGH_LOAD; ``--param`` still overrides); a multi-turn
run is ``--workload multi-turn`` (each turn's prompt is the whole history so far).
``--with-sim --sim-policies round_robin,hybrid,oracle`` puts the simulator's hit rate of
each (the oracle included, which only exists in virtual time) beside the live figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from kvgate.engine.profiles import get_profile
from kvgate.loadgen.cli import bench_once, parse_params, summarize_result
from kvgate.procs import wait_for_ports
from kvgate.procs.handle import terminate
from kvgate.procs.ports import free_port_run
from kvgate.report.records import RequestRecord
from kvgate.report.summary import markdown_table
from kvgate.report.writers import write_report
from kvgate.workloads import WORKLOAD_NAMES, generate_workload
from kvgate.workloads.catalog import LOADS, load_params


def start_engines(
    args: argparse.Namespace, root: Path
) -> tuple[subprocess.Popen[bytes], list[str]]:
    port_file, log = root / "engine.ports", root / "engine.log"
    cmd = [
        sys.executable, "-m", "kvgate", "engine-sim", "--count", str(args.engines),
        "--base-port", "0", "--port-file", str(port_file), "--time-scale", str(args.time_scale),
        "--profile", args.profile,
    ]  # fmt: skip
    if args.kv_blocks is not None:
        cmd += ["--kv-blocks", str(args.kv_blocks)]
    cmd += getattr(args, "kv_events_args", [])
    with log.open("wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
    try:
        ports = wait_for_ports(proc, port_file, args.engines, log, name="engine-sim", timeout=60)
    except BaseException:
        terminate(proc)
        raise
    return proc, [f"http://127.0.0.1:{p}" for p in ports]


def profile_routing(profile: str, time_scale: float) -> dict[str, Any]:
    """hybrid's cost model in the engines' units: prefill rate and step time, per-sequence
    decode cost and sequence slots of the profile, sped up by the time scale (1 for the
    simulator, which runs in engine time)."""
    prof = get_profile(profile)
    return {
        "prefill_tokens_per_s": round(time_scale / prof.seconds_per_compute_token, 1),
        "prefill_step_s": round(prof.step_time(1, 1, 0) / time_scale, 6),
        "decode_seq_s": round(prof.per_seq_s / time_scale, 6),
        "max_running": prof.max_num_seqs,
    }


def start_gateway(
    policy: str, urls: list[str], args: argparse.Namespace, root: Path, config: Path | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    port_file, log = root / f"gateway-{policy}.port", root / f"gateway-{policy}.log"
    cmd = [
        sys.executable, "-m", "kvgate", "serve", "--host", "127.0.0.1", "--port", "0",
        "--port-file", str(port_file), "--policy", policy, "--log-level", "warning",
    ]  # fmt: skip
    if args.scrape_interval is not None:
        cmd += ["--scrape-interval", str(args.scrape_interval)]
    settings: dict[str, Any] = yaml.safe_load(config.read_text()) or {} if config else {}
    settings.setdefault("routing", {}).update(profile_routing(args.profile, args.time_scale))
    merged = root / f"gateway-{policy}.yaml"
    merged.write_text(yaml.safe_dump(settings))
    cmd += ["--config", str(merged)]
    for url in urls:
        cmd += ["--backend", url]
    with log.open("wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
    try:
        (port,) = wait_for_ports(proc, port_file, 1, log, name="gateway", timeout=60)
    except BaseException:
        terminate(proc)
        raise
    return proc, f"http://127.0.0.1:{port}"


# -- policy precise: engines publish KV events, the gateway subscribes ------------------


def _histogram_quantile(metrics_text: str, name: str, q: float) -> float | None:
    """Quantile of a Prometheus histogram summed over its labels (linear within a bucket,
    as PromQL's histogram_quantile)."""
    from prometheus_client.parser import text_string_to_metric_families

    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.name == name + "_bucket":
                le = float(sample.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + sample.value
    if not buckets:
        return None
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    rank, prev_bound, prev_count = q * total, 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if bound == float("inf"):
                return prev_bound
            width = count - prev_count
            frac = (rank - prev_count) / width if width > 0 else 1.0
            return prev_bound + (bound - prev_bound) * frac
        prev_bound, prev_count = bound, count
    return bounds[-1]


def precise_live_row(
    args: argparse.Namespace, workload: Any, root: Path
) -> tuple[dict[str, Any], list[RequestRecord]]:
    """The ``precise`` row: engine-sim publishing KV events (vLLM wire format) and a
    gateway subscribed to every engine; adds the event lag p99 to the summary."""
    import yaml

    base = free_port_run(2 * args.engines)
    events, replay = f"tcp://127.0.0.1:{base}", f"tcp://127.0.0.1:{base + args.engines}"
    saved = args.kv_events_args
    args.kv_events_args = ["--kv-events-endpoint", events, "--kv-events-replay-endpoint", replay]
    engines, urls = start_engines(args, root)
    args.kv_events_args = saved
    gateway = None
    try:
        nodes = [
            {
                "id": f"e{i}",
                "url": url,
                "engine_type": "sim",
                "kv_events": {
                    "endpoint": f"tcp://127.0.0.1:{base + i}",
                    "replay_endpoint": f"tcp://127.0.0.1:{base + args.engines + i}",
                },
            }
            for i, url in enumerate(urls)
        ]
        config = root / "precise.yaml"
        config.write_text(yaml.safe_dump({"nodes": nodes, "routing": {"policy": "precise"}}))
        gateway, args.target = start_gateway("precise", [], args, root, config=config)
        time.sleep(0.5)
        result = asyncio.run(bench_once(args, workload, title="precise"))
        with urllib.request.urlopen(args.target + "/metrics", timeout=5) as resp:
            text = resp.read().decode()
    finally:
        if gateway is not None:
            terminate(gateway)
        terminate(engines)
    summary = summarize_result(result, args.ttft_slo)
    for q in (0.5, 0.99):
        lag = _histogram_quantile(text, "kvgate_kv_events_lag_seconds", q)
        summary[f"kv_event_lag_p{int(q * 100)}_s"] = lag
    return summary, result.records


def sim_hit_rates(args: argparse.Namespace, workload: Any, policies: list[str]) -> dict[str, Any]:
    from kvgate.sim import SimConfig, run_comparison

    config = SimConfig(
        nodes=args.engines,
        profile=args.profile,
        kv_blocks=args.kv_blocks,
        seed=args.seed,
        routing=profile_routing(args.profile, 1.0),
    )
    results = run_comparison(workload, config, policies)
    return {p: r.summary.get("cache_hit_rate") for p, r in results.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workload", default="shared-prefix", choices=WORKLOAD_NAMES)
    ap.add_argument("--policies", default="round_robin,hybrid")
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--profile", default="gemma3-270m-cpu")
    ap.add_argument("--time-scale", type=float, default=50.0)
    ap.add_argument("--kv-blocks", type=int, default=None)
    ap.add_argument("--scrape-interval", type=float, default=None)
    ap.add_argument("--requests", type=int, default=200)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--rate", type=float, default=None, help="open loop, requests/wall s")
    mode.add_argument("--concurrency", type=int, default=None, help="closed loop")
    ap.add_argument("--duration", type=float, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--ttft-slo", type=float, default=2.0)
    ap.add_argument("--load", choices=LOADS, default="normal", help="high: saturated variant")
    ap.add_argument("--with-sim", action="store_true", help="also run the simulator")
    ap.add_argument(
        "--sim-policies", default=None, help="policies for --with-sim (default: --policies)"
    )
    ap.add_argument("--out", type=Path, default=Path("artifacts/compare-live"))
    args = ap.parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    params = load_params(args.workload, args.load)
    params.pop("requests", None)  # --requests decides the size of a live run
    params.update(parse_params(args.param))
    workload = generate_workload(args.workload, seed=args.seed, requests=args.requests, **params)
    # what bench_once reads from a `kvgate bench` namespace
    args.api_key, args.model, args.drain = [], None, None
    results: dict[str, dict[str, Any]] = {}
    records: dict[str, list[RequestRecord]] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kvgate-compare-live-") as tmp:
        root = Path(tmp)
        args.kv_events_args = []
        for policy in policies:
            if policy == "precise":
                results[policy], records[policy] = precise_live_row(args, workload, root)
                continue
            engines, urls = start_engines(args, root)  # fresh: empty caches per policy
            gateway = None
            try:
                gateway, args.target = start_gateway(policy, urls, args, root)
                time.sleep(0.5)  # a first scrape of every engine
                result = asyncio.run(bench_once(args, workload, title=policy))
            finally:
                if gateway is not None:
                    terminate(gateway)
                terminate(engines)
            results[policy] = summarize_result(result, args.ttft_slo)
            records[policy] = result.records
    wall = time.perf_counter() - started
    if args.with_sim:
        sim_policies = (args.sim_policies or args.policies).split(",")
        for policy, hit in sim_hit_rates(args, workload, sim_policies).items():
            if policy in results:
                results[policy]["sim_cache_hit_rate"] = hit
            else:
                print(f"{policy}: simulated hit rate {hit}")
    meta = {
        "workload": args.workload,
        "params": " ".join(args.param) or "defaults",
        "load": args.load,
        "requests": len(workload.items),
        "engines": args.engines,
        "profile": args.profile,
        "kv_blocks_per_engine": args.kv_blocks or "profile default",
        "time_scale": args.time_scale,
        "mode": f"closed, {args.concurrency} in flight"
        if args.concurrency
        else (f"open, {args.rate} req/s" if args.rate else "open, workload arrivals / time scale"),
        "cpus": os.cpu_count(),
        "wall_s": round(wall, 1),
        "command": "bench/compare_live.py " + " ".join(sys.argv[1:] if argv is None else argv),
    }
    write_report(
        args.out,
        results,
        records,
        f"kvgate live comparison: {args.workload} on {args.engines} engine-sim nodes",
        meta=meta,
        baseline=policies[0],
    )
    print(markdown_table(results, baseline=policies[0]))
    if "precise" in results:
        row = results["precise"]
        p50, p99 = row.get("kv_event_lag_p50_s"), row.get("kv_event_lag_p99_s")
        print(f"precise: KV event lag p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms"
              if p50 is not None and p99 is not None else "precise: no KV event batches applied")  # fmt: skip
    if args.with_sim:
        for p, r in results.items():
            print(f"{p}: live hit rate {r['cache_hit_rate']}, sim {r.get('sim_cache_hit_rate')}")
    print(f"\nreport in {args.out} ({wall:.1f} s wall)")
    return 1 if any(r["lost"] for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
