"""Forecast on the daily-curve workload: its MAPE and its effect on goodput at the peak.

Runs the `daily` workload through the simulator with admission and the dynamic quota,
once with flag `forecast` off (the plain dynamic quota) and once on (the quota sees
capacity / forecast demand ratio), on the identical request stream. Reports the
forecast's MAPE (all scored minutes, and the peak window), and goodput (requests whose
TTFT met the SLO, per second) over the whole run and in the peak window of the last day
(09:00-17:00), plus rejections and TTFT.

    .venv/bin/python bench/forecast_daily.py --nodes 1 --kv-blocks 256
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from kvgate.report.records import RequestRecord
from kvgate.sim.cluster import ClusterSim, SimConfig
from kvgate.workloads import generate_workload


def window(records: list[RequestRecord], start: float, end: float, slo: float) -> dict[str, Any]:
    inside = [r for r in records if start <= r.arrival < end]
    good = [
        r for r in inside if r.status in ("ok", "degraded") and r.ttft is not None and r.ttft <= slo
    ]
    ttfts = sorted(r.ttft for r in inside if r.ttft is not None)
    if not ttfts:
        ttfts = [float("nan")]
    return {
        "requests": len(inside),
        "goodput_rps": len(good) / (end - start),
        "good_fraction": len(good) / len(inside) if inside else 0.0,
        "rejected": sum(r.status == "rejected" for r in inside),
        "ttft_p50_s": ttfts[len(ttfts) // 2] if ttfts else None,
        "ttft_p90_s": ttfts[int(0.9 * (len(ttfts) - 1))] if ttfts else None,
    }


def run(
    args: argparse.Namespace, forecast: bool, flags: dict[str, bool] | None = None
) -> dict[str, Any]:
    workload = generate_workload(
        "daily",
        seed=args.seed,
        days=args.days,
        day_s=args.day_s,
        peak_rate=args.peak_rate,
        system_len=args.system_len,
        query_len=args.query_len,
    )
    config = SimConfig(
        nodes=args.nodes,
        profile=args.profile,
        kv_blocks=args.kv_blocks,
        admission=True,
        seed=args.seed,
        slo_ttft_s=args.slo,
        flags={"forecast": forecast, **(flags or {})},
        degrade_modes={},
    )
    t0 = time.perf_counter()
    sim = ClusterSim(workload, config, args.policy)
    assert sim.forecast is not None
    sim.forecast.mode = args.mode
    result = sim.run()
    fc = sim.forecast
    wall = time.perf_counter() - t0
    day_s = args.day_s
    sample_s = float(workload.params["sample_s"])
    last = (args.days - 1) * day_s
    peak = window(result.records, last + day_s * 9 / 24, last + day_s * 17 / 24, args.slo)
    s = result.summary
    return {
        "forecast": "on" if forecast else "off",
        "label": ", ".join(f"{k} off" for k, v in (flags or {}).items() if not v),
        "requests": s["requests"],
        "goodput_rps": s["goodput_rps"],
        "rejected": s["rejected"],
        "ttft_p50_s": s["ttft_p50_s"],
        "ttft_p99_s": s["ttft_p99_s"],
        "peak": peak,
        "forecast_mape_pct": s.get("forecast_mape_pct"),
        "forecast_mape_peak_pct": fc.score.mape_where(
            lambda m: 9 / 24 <= (m * sample_s % day_s) / day_s < 17 / 24
        ),
        "forecast_scored_samples": s.get("forecast_scored_samples"),
        "quota_adjustments": s.get("quota_adjustments"),
        "wall_s": wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--kv-blocks", type=int, default=256)
    ap.add_argument("--profile", default="llama3-8b-h100")
    ap.add_argument("--policy", default="hybrid")
    ap.add_argument("--days", type=int, default=2)
    ap.add_argument("--day-s", type=float, default=7200.0)
    ap.add_argument("--peak-rate", type=float, default=1.5)
    ap.add_argument("--system-len", type=int, default=512, help="shared system prompt tokens")
    ap.add_argument("--query-len", type=int, default=256, help="unique prompt tokens")
    ap.add_argument("--slo", type=float, default=2.0, help="TTFT SLO (s) for goodput")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mode", default="raise", choices=("raise", "track", "hold"))
    ap.add_argument(
        "--references", action="store_true", help="also run dynamic quota off, admission off"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [run(args, False), run(args, True)]
    if args.references:
        rows += [run(args, False, {"dynamic_quota": False}), run(args, False, {"admission": False})]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(
        "| forecast | MAPE % (all) | MAPE % (09-17) | goodput req/s (all) | goodput req/s (peak) | good % (peak) "
        "| rejected (peak) | TTFT p50 peak (s) | TTFT p90 peak (s) | quota steps |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        p = r["peak"]
        mape = "-" if r["forecast_mape_pct"] is None else f"{r['forecast_mape_pct']:.1f}"
        peak_mape = r["forecast_mape_peak_pct"]
        pm = "-" if peak_mape is None else f"{peak_mape:.1f}"
        label = f"{r['forecast']} ({args.mode})" if r["forecast"] == "on" else "off"
        if r["label"]:
            label = f"reference: {r['label']}"
        print(
            f"| {label} | {mape} | {pm} | {r['goodput_rps']:.3f} | {p['goodput_rps']:.3f} "
            f"| {100 * p['good_fraction']:.1f} | {p['rejected']} | {p['ttft_p50_s']:.2f} "
            f"| {p['ttft_p90_s']:.2f} | {r['quota_adjustments']} |"
        )
    base, fc = rows[0]["peak"]["goodput_rps"], rows[1]["peak"]["goodput_rps"]
    print(f"\npeak goodput with forecast / without: {fc / base:.3f}x" if base else "")


if __name__ == "__main__":
    main()
