"""Admission live: ``kvgate serve`` (default admission) in front of engine-sims, vs admission off.

Issue #26 item 4. One ``kvgate engine-sim --count N`` process (``--time-scale 1``,
``--decode-ms-per-token D``, ``--prefill-tokens-per-s``, ``--kv-blocks``) behind one
``kvgate serve`` whose config only adds two tenants with API keys (``interactive``,
1 s TTFT SLO; ``batch``, default class ``batch``, 30 s): admission, the prefill gate and
the dynamic quota run with their defaults. Per decode speed:

1. saturation: the knee of goodput (requests meeting their class's TTFT SLO per second)
   vs offered load, with ``--flag admission=off``, by a short bounded sweep of open-loop
   rates around the engines' decode capacity (skipped by ``--saturation``);
2. each load point (``--loads``, multiples of saturation) runs three rows back to back,
   each with fresh engines and a fresh gateway and the same request stream: admission
   on (defaults) / admission off (``--flag admission=off``) / prefill gate off
   (``--flag prefill_gate=off``).

Workload: ``apps`` (kvgate.workloads.apps) with 24 apps of ~2,000-token system prompts
(Zipf popularity), 32–256-token questions, 32–64 output tokens, streamed with
``include_usage``; ``--batch-share`` of the requests come from the ``batch`` tenant in
bursts. Each row reports served / 429 / 408 / other, goodput, TTFT p50/p99 per class,
engine utilisation (engine /metrics: uncached prompt tokens over prefill capacity, mean
running sequences over ``max_num_seqs``), CPU of the gateway / engines / load generator,
and the gateway's ``kvgate_admission_held_with_headroom_total`` (summed over reasons) and
``kvgate_admission_shrink_skipped_with_headroom_total``; ratios are against admission off
at the same load point. Writes ``table.md`` and ``results.json`` into ``--out``.

    .venv/bin/python bench/admission_live.py --quick --out /tmp/al-quick
    .venv/bin/python bench/admission_live.py --decode 20 --loads 0.3,0.9,1.5 \\
        --duration 20 --out /tmp/al
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from kvgate.engine.profiles import DECODE_BATCH_SLOWDOWN, get_profile
from kvgate.loadgen.cli import bench_once
from kvgate.procs import start_engine_process, start_gateway_process
from kvgate.report.records import RequestRecord
from kvgate.report.summary import DEFAULT_CLASS_SLOS, percentile
from kvgate.workloads import Workload, generate_workload

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.engine_sim import cpu_seconds  # noqa: E402

PROFILE = "gemma3-270m-cpu"  # engine-sim's default: its max_num_seqs is the slot count
API_KEYS = {"interactive": "sk-live-interactive", "batch": "sk-live-batch"}
ROWS: dict[str, list[str]] = {
    "admission on": [],
    "admission off": ["--flag", "admission=off"],
    "prefill gate off": ["--flag", "prefill_gate=off"],
}
BASE_ROW = "admission off"
CLASSES = ("interactive", "batch")
# the apps workload as issue #26 describes it (batch_doc_len 0: batch asks the same
# questions, it differs by tenant and class only)
WORKLOAD_PARAMS: dict[str, Any] = {
    "apps": 24,
    "system_len": 2000,
    "user_len_min": 32,
    "user_len_max": 256,
    "output_min": 32,
    "output_max": 64,
    "batch_doc_len": 0,
}
MEAN_OUTPUT = (WORKLOAD_PARAMS["output_min"] + WORKLOAD_PARAMS["output_max"]) / 2
KNEE_FRACTIONS = (0.25, 0.5, 0.75, 1.0, 1.25)  # of the decode-capacity estimate
MAX_KNEE_POINTS = 8
COUNTERS = ("vllm:prompt_tokens", "vllm:prefix_cache_hits", "vllm:generation_tokens")
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
GATEWAY_GAUGES = ("kvgate_quota_total_tokens", "kvgate_admission_prefill_limit_tokens")


# -- workload and processes ------------------------------------------------------------


def workload(rate: float, args: argparse.Namespace) -> Workload:
    """``rate`` requests/s for ``args.duration`` s: (1 - batch share) interactive Poisson
    arrivals and batch bursts of ``args.batch_burst`` at the rest of the rate."""
    batch_rate = rate * args.batch_share
    every = args.batch_burst / batch_rate if batch_rate > 0 else 10 * args.duration
    return generate_workload(
        "apps",
        seed=args.seed,
        rate=rate - batch_rate,
        duration_s=args.duration,
        batch_burst=args.batch_burst if batch_rate > 0 else 0,
        batch_every_s=every,
        **WORKLOAD_PARAMS,
    )


def slots_per_engine(args: argparse.Namespace) -> int:
    """Sequence slots of one engine: ``--max-num-seqs``, else the profile's."""
    return int(args.max_num_seqs or get_profile(PROFILE).max_num_seqs)


def capacity_estimate(decode_ms: float, args: argparse.Namespace) -> float:
    """Requests/s the engines decode with every sequence slot busy (prefill ignored)."""
    slots = slots_per_engine(args)
    step_s = decode_ms / 1000 * (1 + DECODE_BATCH_SLOWDOWN * (slots - 1))
    return args.engines * slots / (MEAN_OUTPUT * step_s)


def gateway_config(decode_ms: float, args: argparse.Namespace) -> dict[str, Any]:
    """Two tenants with API keys; everything else in admission is the default. The
    routing cost model is told the engines' speeds (as compare_live does)."""
    return {
        "routing": {
            "prefill_tokens_per_s": args.prefill_tokens_per_s,
            "prefill_step_s": decode_ms / 1000,
            "decode_seq_s": decode_ms / 1000 * DECODE_BATCH_SLOWDOWN,
            "max_running": slots_per_engine(args),
        },
        "admission": {
            "tenants": [
                {"name": "interactive", "api_keys": [API_KEYS["interactive"]]},
                {"name": "batch", "api_keys": [API_KEYS["batch"]], "default_class": "batch"},
            ]
        },
    }


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its direct children (``kvgate serve --workers N``)."""
    total = cpu_seconds(pid)
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    for child in children:
        with contextlib.suppress(OSError, ValueError):
            total += cpu_seconds(int(child))
    return total


# -- metrics ---------------------------------------------------------------------------


def metric_sums(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Each family's samples summed over labels (a counter's ``_total`` sample)."""
    out = dict.fromkeys(names, 0.0)
    for family in text_string_to_metric_families(text):
        if family.name in out:
            for sample in family.samples:
                if sample.name in (family.name, family.name + "_total"):
                    out[family.name] += sample.value
    return out


def by_label(text: str, name: str, *labels: str) -> dict[str, float]:
    """A counter's ``_total`` samples summed by the given labels (joined with ``/``)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == name:
            for sample in family.samples:
                if sample.name == name + "_total":
                    key = "/".join(sample.labels.get(label, "") for label in labels)
                    out[key] = out.get(key, 0.0) + sample.value
    return out


async def fetch(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as resp:
        return await resp.text()


class EngineSampler:
    """Engine /metrics once a second while the row issues load: counters at the start
    and at the end of the issue window, gauges averaged over it; and the gateway's
    quota total and prefill-gate limit at each tick."""

    def __init__(self, urls: list[str], gateway: str, window_s: float) -> None:
        self.urls = urls
        self.gateway = gateway
        self.limits: list[dict[str, float]] = []
        self.window_s = window_s
        self.first: dict[str, float] | None = None
        self.last: dict[str, float] | None = None
        self.span_s = 0.0
        self.gauges: list[dict[str, float]] = []

    async def snapshot(self, session: aiohttp.ClientSession) -> dict[str, float]:
        texts = await asyncio.gather(*(fetch(session, u) for u in self.urls))
        total = dict.fromkeys(COUNTERS + GAUGES, 0.0)
        for text in texts:
            for k, v in metric_sums(text, COUNTERS + GAUGES).items():
                total[k] += v
        return total

    async def run(self) -> None:
        async with aiohttp.ClientSession() as session:
            t0 = time.monotonic()
            self.first = await self.snapshot(session)
            while (elapsed := time.monotonic() - t0) < self.window_s:
                await asyncio.sleep(min(1.0, max(0.05, self.window_s - elapsed)))
                try:
                    snap = await self.snapshot(session)
                except (aiohttp.ClientError, TimeoutError):
                    continue
                self.last, self.span_s = snap, time.monotonic() - t0
                self.gauges.append({g: snap[g] for g in GAUGES})
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    text = await fetch(session, self.gateway)
                    self.limits.append(metric_sums(text, GATEWAY_GAUGES))

    def summary(self, engines: int, slots: int, prefill_tokens_per_s: float) -> dict[str, Any]:
        if self.first is None or self.last is None or self.span_s <= 0:
            return {}
        d = {c: self.last[c] - self.first[c] for c in COUNTERS}
        uncached = d["vllm:prompt_tokens"] - d["vllm:prefix_cache_hits"]
        slots = engines * slots
        mean = {g: sum(s[g] for s in self.gauges) / len(self.gauges) for g in GAUGES}
        return {
            "window_s": round(self.span_s, 2),
            "prompt_tokens": d["vllm:prompt_tokens"],
            "prefix_cache_hit_tokens": d["vllm:prefix_cache_hits"],
            "generation_tokens_per_s": d["vllm:generation_tokens"] / self.span_s,
            "prefill_util": uncached / (prefill_tokens_per_s * engines * self.span_s),
            "slot_util": mean["vllm:num_requests_running"] / slots,
            "mean_running": mean["vllm:num_requests_running"],
            "mean_waiting": mean["vllm:num_requests_waiting"],
            "mean_kv_usage": mean["vllm:kv_cache_usage_perc"] / engines,
        }

    def gateway_summary(self) -> dict[str, Any]:
        """Quota total and prefill limit over the issue window: first, min, last."""
        out: dict[str, Any] = {}
        for name in GATEWAY_GAUGES:
            values = [x[name] for x in self.limits]
            if values:
                short = name.removeprefix("kvgate_").removesuffix("_tokens")
                out[short] = {"first": values[0], "min": min(values), "last": values[-1]}
        return out


# -- one row ---------------------------------------------------------------------------


def bench_args(target: str, args: argparse.Namespace) -> argparse.Namespace:
    """What ``bench_once`` reads from a ``kvgate bench`` namespace: open loop at the
    workload's own arrival times."""
    return argparse.Namespace(
        target=target,
        time_scale=1.0,
        rate=None,
        concurrency=None,
        duration=args.duration,
        requests=None,
        api_key=[f"{t}={k}" for t, k in API_KEYS.items()],
        model=None,
        timeout=args.timeout,
        drain=args.drain if args.drain is not None else max(10.0, args.duration),
    )


def summarize_row(records: list[RequestRecord], window_s: float) -> dict[str, Any]:
    served = [r for r in records if r.status in ("ok", "degraded")]
    met = sum(
        1
        for r in served
        if r.ttft is not None and r.ttft <= DEFAULT_CLASS_SLOS.get(r.priority_class, 1.0)
    )
    out: dict[str, Any] = {
        "issued": len(records),
        "served": len(served),
        "http_429": sum(1 for r in records if r.http_status == 429),
        "http_408": sum(1 for r in records if r.http_status == 408),
        "goodput_rps": met / window_s,
        "offered_rps": len(records) / window_s,
    }
    out["other"] = out["issued"] - out["served"] - out["http_429"] - out["http_408"]
    for c in CLASSES:
        ttfts = [r.ttft for r in served if r.priority_class == c and r.ttft is not None]
        out[f"{c}_issued"] = sum(1 for r in records if r.priority_class == c)
        out[f"{c}_http_429"] = sum(
            1 for r in records if r.priority_class == c and r.http_status == 429
        )
        out[f"{c}_ttft_p50_s"] = percentile(ttfts, 50)
        out[f"{c}_ttft_p99_s"] = percentile(ttfts, 99)
    out["cache_hit_rate"] = (
        sum(r.cached_tokens for r in served) / max(1, sum(r.prompt_tokens for r in served))
        if served
        else None
    )
    return out


async def drive(
    target: str, urls: list[str], wl: Workload, args: argparse.Namespace, title: str
) -> tuple[Any, EngineSampler]:
    sampler = EngineSampler(urls, target, args.duration)
    sampling = asyncio.create_task(sampler.run())
    try:
        result = await bench_once(bench_args(target, args), wl, title=title)
    finally:
        if not sampling.done():
            sampling.cancel()
        await asyncio.gather(sampling, return_exceptions=True)
    return result, sampler


def run_row(name: str, decode_ms: float, rate: float, args: argparse.Namespace) -> dict[str, Any]:
    """Fresh engines and a fresh gateway, one workload at ``rate``, both stopped."""
    wl = workload(rate, args)
    engines = start_engine_process(
        count=args.engines,
        profile=PROFILE,
        time_scale=1.0,
        kv_blocks=args.kv_blocks,
        extra_args=[
            "--decode-ms-per-token", str(decode_ms),
            "--prefill-tokens-per-s", str(args.prefill_tokens_per_s),
            "--max-num-seqs", str(slots_per_engine(args)),
        ],
    )  # fmt: skip
    gateway = None
    try:
        gateway = start_gateway_process(
            backends=engines.urls,
            config=gateway_config(decode_ms, args),
            extra_args=["--log-level", "warning", "--workers", str(args.workers), *ROWS[name]],
        )
        time.sleep(args.settle)  # a first scrape of every engine
        cpu0 = (tree_cpu(gateway.pid), cpu_seconds(engines.pid), time.process_time())
        t0 = time.monotonic()
        title = f"d{decode_ms:g} {rate:.1f}rps {name}"
        result, sampler = asyncio.run(drive(gateway.url, engines.urls, wl, args, title))
        wall = time.monotonic() - t0
        cpu1 = (tree_cpu(gateway.pid), cpu_seconds(engines.pid), time.process_time())
        text = get_text(gateway.url + "/metrics")
        held = by_label(text, "kvgate_admission_held_with_headroom", "reason")
        skipped = by_label(text, "kvgate_admission_shrink_skipped_with_headroom", "limit")
        gate_held = by_label(text, "kvgate_admission_prefill_held", "priority_class")
        decisions = by_label(text, "kvgate_admission_decisions", "tenant", "decision", "reason")
    finally:
        if gateway is not None:
            gateway.stop()
        engines.stop()
    row = summarize_row(result.records, args.duration)
    row.update(
        row=name,
        decode_ms=decode_ms,
        rate_rps=rate,
        workload_requests=len(wl.items),
        held_with_headroom=sum(held.values()),
        held_with_headroom_by_reason=held,
        shrink_skipped_with_headroom=sum(skipped.values()),
        shrink_skipped_by_limit=skipped,
        prefill_gate_held=sum(gate_held.values()),
        admission_decisions=decisions,
        gateway_limits=sampler.gateway_summary(),
        engine=sampler.summary(args.engines, slots_per_engine(args), args.prefill_tokens_per_s),
        gateway_cpu_cores=(cpu1[0] - cpu0[0]) / wall,
        engines_cpu_cores=(cpu1[1] - cpu0[1]) / wall,
        loadgen_cpu_cores=(cpu1[2] - cpu0[2]) / wall,
        wall_s=round(wall, 1),
        loadavg_1m=os.getloadavg()[0],
        error_kinds=dict(result.errors),
    )
    print(
        f"{title}: issued {row['issued']} served {row['served']} 429 {row['http_429']} "
        f"408 {row['http_408']} other {row['other']} goodput {row['goodput_rps']:.2f} rps "
        f"int p99 {fmt_s(row['interactive_ttft_p99_s'])} held {row['held_with_headroom']:g} "
        f"gw cpu {row['gateway_cpu_cores']:.2f}",
        flush=True,
    )
    return row


def get_text(url: str) -> str:
    """GET a URL's text with urllib (outside any event loop)."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


# -- knee ------------------------------------------------------------------------------


def find_knee(decode_ms: float, args: argparse.Namespace) -> tuple[float, list[dict[str, Any]]]:
    """Offered rate of the highest goodput with admission off, from a bounded sweep: a
    few fractions of the decode-capacity estimate, extended down (best at the lowest
    point) or up (best at the highest) while points remain."""
    est = capacity_estimate(decode_ms, args)
    fractions = list(args.knee_fractions)
    points: list[dict[str, Any]] = []
    saved = args.duration
    args.duration = args.knee_duration
    try:
        todo = [est * f for f in fractions]
        while todo and len(points) < args.knee_points:
            rate = todo.pop(0)
            row = run_row(BASE_ROW, decode_ms, rate, args)
            points.append(row)
            best = max(points, key=lambda p: p["goodput_rps"])
            if row["goodput_rps"] < 0.7 * best["goodput_rps"]:
                todo = []  # well past the knee
            if not todo and len(points) < args.knee_points:
                rates = sorted(p["rate_rps"] for p in points)
                if best["rate_rps"] == rates[0] and rates[0] > 0.5:
                    todo = [rates[0] / 2]
                elif (
                    best["rate_rps"] == rates[-1]
                    and row["goodput_rps"] >= 0.7 * best["goodput_rps"]
                ):
                    todo = [rates[-1] * 1.5]
    finally:
        args.duration = saved
    best = max(points, key=lambda p: p["goodput_rps"])
    return float(best["rate_rps"]), points


# -- report ----------------------------------------------------------------------------


def fmt_s(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def add_ratios(rows: list[dict[str, Any]]) -> None:
    base = {(r["decode_ms"], r["load"]): r for r in rows if r["row"] == BASE_ROW}
    for r in rows:
        b = base.get((r["decode_ms"], r["load"]))
        if b is None:
            continue
        r["goodput_vs_off"] = ratio(r["goodput_rps"], b["goodput_rps"])
        for c in CLASSES:
            r[f"{c}_ttft_p99_vs_off"] = ratio(r[f"{c}_ttft_p99_s"], b[f"{c}_ttft_p99_s"])


def fmt_x(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}×"


def table(rows: list[dict[str, Any]], saturation: dict[float, float]) -> str:
    lines = [
        "| decode ms | load | offered rps | row | served | 429 (int/batch) | 408 | other | goodput rps "
        "| goodput vs off | int TTFT p50 / p99 (s) | int p99 vs off | batch TTFT p50 / p99 (s) "
        "| batch p99 vs off | prefill util | slot util | engine waiting | gateway CPU "
        "| quota total first / min (k) | held w/ headroom | shrink skipped |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        e = r["engine"] or {}
        lines.append(
            f"| {r['decode_ms']:g} | {r['load']:g}× | {r['offered_rps']:.1f} | {r['row']} "
            f"| {r['served']} | {r['http_429']} ({r['interactive_http_429']}/{r['batch_http_429']}) "
            f"| {r['http_408']} | {r['other']} "
            f"| {r['goodput_rps']:.2f} | {fmt_x(r.get('goodput_vs_off'))} "
            f"| {fmt_s(r['interactive_ttft_p50_s'])} / {fmt_s(r['interactive_ttft_p99_s'])} "
            f"| {fmt_x(r.get('interactive_ttft_p99_vs_off'))} "
            f"| {fmt_s(r['batch_ttft_p50_s'])} / {fmt_s(r['batch_ttft_p99_s'])} "
            f"| {fmt_x(r.get('batch_ttft_p99_vs_off'))} "
            f"| {e.get('prefill_util', 0):.0%} | {e.get('slot_util', 0):.0%} "
            f"| {e.get('mean_waiting', 0):.1f} | {r['gateway_cpu_cores']:.2f} | {quota(r)} "
            f"| {r['held_with_headroom']:g} | {r['shrink_skipped_with_headroom']:g} |"
        )
    sat = ", ".join(f"decode {d:g} ms: {s:.1f} rps" for d, s in saturation.items())
    return f"saturation (admission off, knee of goodput): {sat}\n\n" + "\n".join(lines)


def quota(r: dict[str, Any]) -> str:
    q = (r.get("gateway_limits") or {}).get("quota_total")
    return "–" if not q else f"{q['first'] / 1000:.0f} / {q['min'] / 1000:.0f}"


def knee_table(knees: dict[float, list[dict[str, Any]]]) -> str:
    lines = [
        "| decode ms | offered rps | served | other | goodput rps | int TTFT p99 (s) "
        "| slot util | prefill util | gateway CPU |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for d, points in knees.items():
        for p in sorted(points, key=lambda p: p["rate_rps"]):
            e = p["engine"] or {}
            lines.append(
                f"| {d:g} | {p['offered_rps']:.1f} | {p['served']} | {p['other']} "
                f"| {p['goodput_rps']:.2f} | {fmt_s(p['interactive_ttft_p99_s'])} "
                f"| {e.get('slot_util', 0):.0%} | {e.get('prefill_util', 0):.0%} "
                f"| {p['gateway_cpu_cores']:.2f} |"
            )
    return "\n".join(lines)


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of load per row")
    ap.add_argument("--loads", default="0.3,0.6,0.9,1.5,2", help="multiples of saturation")
    ap.add_argument("--decode", default="5,20,40", help="engine decode ms per token, comma list")
    ap.add_argument(
        "--saturation",
        default=None,
        help="requests/s at the knee (one, or one per --decode): skip the search",
    )
    ap.add_argument("--quick", action="store_true", help="a tiny run (smoke check)")
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--kv-blocks", type=int, default=3750, help="per engine (16-token blocks)")
    ap.add_argument(
        "--max-num-seqs", type=int, default=None, help="sequence slots per engine (profile's: 8)"
    )
    ap.add_argument("--prefill-tokens-per-s", type=float, default=20000.0)
    ap.add_argument("--batch-share", type=float, default=0.2, help="of requests, batch tenant")
    ap.add_argument("--batch-burst", type=int, default=4, help="batch requests per burst")
    ap.add_argument("--knee-duration", type=float, default=None, help="s per knee point")
    ap.add_argument("--knee-points", type=int, default=MAX_KNEE_POINTS)
    ap.add_argument(
        "--workers", type=int, default=1, help="kvgate serve --workers (1: one process)"
    )
    ap.add_argument("--timeout", type=float, default=120.0, help="per-request seconds")
    ap.add_argument("--drain", type=float, default=None, help="s after issuing (default: duration)")
    ap.add_argument("--settle", type=float, default=1.0, help="s between start and load")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("artifacts/admission-live"))
    args = ap.parse_args(argv)
    args.knee_fractions = KNEE_FRACTIONS
    if args.quick:
        args.duration, args.loads, args.decode = 5.0, "0.3,1.5", "20"
        args.knee_fractions, args.knee_points = (0.4, 0.8), 2
    if args.knee_duration is None:
        args.knee_duration = min(args.duration, 20.0)
    decodes, loads = floats(args.decode), floats(args.loads)
    given = floats(args.saturation) if args.saturation else []
    if given and len(given) not in (1, len(decodes)):
        ap.error("--saturation: one value, or one per --decode")
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    saturation: dict[float, float] = {}
    knees: dict[float, list[dict[str, Any]]] = {}
    rows: list[dict[str, Any]] = []
    for i, d in enumerate(decodes):
        if given:
            saturation[d] = given[i] if len(given) > 1 else given[0]
        else:
            saturation[d], knees[d] = find_knee(d, args)
            print(f"decode {d:g} ms: saturation {saturation[d]:.1f} rps", flush=True)
        for load in loads:
            for name in ROWS:  # interleaved: the three rows of one load point back to back
                row = run_row(name, d, load * saturation[d], args)
                row["load"] = load
                rows.append(row)
    add_ratios(rows)
    wall = time.perf_counter() - started
    meta = {
        "command": "bench/admission_live.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "cpus": os.cpu_count(),
        "engines": args.engines,
        "profile": PROFILE,
        "max_num_seqs": slots_per_engine(args),
        "kv_blocks_per_engine": args.kv_blocks,
        "prefill_tokens_per_s": args.prefill_tokens_per_s,
        "workload": {
            "name": "apps",
            **WORKLOAD_PARAMS,
            "batch_share": args.batch_share,
            "batch_burst": args.batch_burst,
            "seed": args.seed,
        },
        "class_slos_s": dict(DEFAULT_CLASS_SLOS),
        "duration_s": args.duration,
        "knee_duration_s": args.knee_duration,
        "gateway_workers": args.workers,
        "saturation_rps": saturation,
        "wall_s": round(wall, 1),
    }
    text = table(rows, saturation)
    if knees:
        text += "\n\nknee sweep (admission off):\n\n" + knee_table(knees)
    print(text)
    (args.out / "table.md").write_text(text + "\n")
    (args.out / "results.json").write_text(
        json.dumps({"meta": meta, "knee": knees, "rows": rows}, indent=2, default=str)
    )
    print(f"\nwrote {args.out}/table.md and results.json ({wall:.0f} s wall)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
