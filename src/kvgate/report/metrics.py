"""Latency percentiles, throughput, cache hit rate, load spread and fairness."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from kvgate.sim.cluster import SimResult


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    k = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[k]


def jain(values: list[float]) -> float:
    if not values or not any(values):
        return 1.0
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


def compute_metrics(result: SimResult, *, ttft_slo_s: float = 2.0) -> dict[str, Any]:
    recs = result.records
    done = [r for r in recs if r.finished is not None and r.first_token is not None]
    ttft = [r.first_token - r.arrival for r in done if r.first_token is not None]
    e2e = [r.finished - r.arrival for r in done if r.finished is not None]
    tpot = [
        (r.finished - r.first_token) / (r.output_tokens - 1)
        for r in done
        if r.finished is not None and r.first_token is not None and r.output_tokens > 1
    ]
    span = max((r.finished or 0.0) for r in done) - min(r.arrival for r in recs) if done else 0.0
    out_tokens = sum(r.output_tokens for r in done)
    prompt_tokens = sum(r.prompt_tokens for r in done)
    cached = sum(r.cached_tokens for r in done)
    expected = sum(r.expected_cached for r in done)
    per_node = Counter(r.node for r in done)
    node_counts = [float(per_node.get(n, 0)) for n in result.node_ids]
    mean = statistics.fmean(node_counts) if node_counts else 0.0
    cv = statistics.pstdev(node_counts) / mean if mean else 0.0
    per_tenant = Counter(r.tenant for r in done)
    tenant_tput = {t: n / span if span else 0.0 for t, n in sorted(per_tenant.items())}
    rejected = sum(1 for r in recs if r.rejected)
    retried = sum(r.retries for r in recs)
    return {
        "policy": result.policy,
        "requests": len(recs),
        "completed": len(done),
        "rejected": rejected,
        "lost": len(recs) - len(done) - rejected,
        "retried": retried,
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p90_s": percentile(ttft, 90),
        "ttft_p99_s": percentile(ttft, 99),
        "tpot_mean_s": statistics.fmean(tpot) if tpot else 0.0,
        "e2e_p50_s": percentile(e2e, 50),
        "e2e_p99_s": percentile(e2e, 99),
        "throughput_rps": len(done) / span if span else 0.0,
        "output_tokens_per_s": out_tokens / span if span else 0.0,
        "goodput_rps": sum(1 for x in ttft if x <= ttft_slo_s) / span if span else 0.0,
        "ttft_slo_s": ttft_slo_s,
        "cache_hit_rate": cached / prompt_tokens if prompt_tokens else 0.0,
        "predicted_cached_tokens": expected,
        "actual_cached_tokens": cached,
        "load_cv": cv,
        "tenant_throughput_rps": tenant_tput,
        "tenant_jain": jain(list(tenant_tput.values())),
    }


_COLUMNS = [
    ("policy", "policy", "{}"),
    ("ttft_p50_s", "TTFT p50 s", "{:.3f}"),
    ("ttft_p90_s", "p90", "{:.3f}"),
    ("ttft_p99_s", "p99", "{:.3f}"),
    ("tpot_mean_s", "TPOT s", "{:.4f}"),
    ("e2e_p50_s", "E2E p50 s", "{:.2f}"),
    ("throughput_rps", "req/s", "{:.2f}"),
    ("output_tokens_per_s", "out tok/s", "{:.0f}"),
    ("goodput_rps", "goodput", "{:.2f}"),
    ("cache_hit_rate", "hit rate", "{:.3f}"),
    ("load_cv", "load CV", "{:.3f}"),
    ("tenant_jain", "Jain", "{:.3f}"),
    ("rejected", "rejected", "{}"),
    ("lost", "lost", "{}"),
]


def markdown_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| " + " | ".join(h for _, h, _ in _COLUMNS) + " |",
        "|" + "---|" * len(_COLUMNS),
    ]
    for row in rows:
        lines.append("| " + " | ".join(f.format(row[k]) for k, _, f in _COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def write_reports(out: Path, summary: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    rows = summary["policies"]
    (out / "report.md").write_text(markdown_table(rows))
    keys = [k for k, _, _ in _COLUMNS]
    csv = [",".join(keys)] + [",".join(str(r[k]) for k in keys) for r in rows]
    (out / "report.csv").write_text("\n".join(csv) + "\n")
