"""Figures of one run: latency percentiles, throughput, goodput, hit rate, spread, fairness."""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from kvgate.report.records import RequestRecord

# TTFT SLO per priority class (seconds): goodput counts only requests that met theirs
DEFAULT_CLASS_SLOS: Mapping[str, float] = {"interactive": 1.0, "batch": 30.0}


def parse_class_slos(values: Sequence[str]) -> dict[str, float]:
    """``CLASS=SECONDS`` items (CLI flags) over the defaults; ValueError names the bad one."""
    out = dict(DEFAULT_CLASS_SLOS)
    for item in values:
        for part in item.split(","):
            name, _, seconds = part.partition("=")
            try:
                value = float(seconds)
            except ValueError:
                value = -1.0
            if not name or value <= 0:
                raise ValueError(f"--class-slo {part!r}: expected CLASS=SECONDS with SECONDS > 0")
            out[name] = value
    return out


def _goodput(
    ok: Sequence[RequestRecord],
    duration_s: float,
    class_slos: Mapping[str, float],
    fallback_slo_s: float,
) -> dict[str, Any]:
    """Output tokens/s (and req/s) of requests that met their class's TTFT SLO."""
    tokens: dict[str, float] = defaultdict(float)
    met = 0
    p99: dict[str, float | None] = {}
    by_class: dict[str, list[float]] = defaultdict(list)
    for r in ok:
        if r.ttft is None:
            continue
        by_class[r.priority_class].append(r.ttft)
        if r.ttft <= class_slos.get(r.priority_class, fallback_slo_s):
            tokens[r.priority_class] += r.output_tokens
            met += 1
    for name, values in sorted(by_class.items()):
        p99[name] = percentile(values, 99)
    return {
        "goodput_tokens_per_s": sum(tokens.values()) / duration_s,
        "goodput_rps": met / duration_s,
        "goodput_tokens_per_s_by_class": {
            c: tokens.get(c, 0.0) / duration_s for c in sorted(by_class)
        },
        "ttft_p99_s_by_class": p99,
        "class_slo_s": dict(class_slos),
    }


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100); None for no values."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def jain_fairness(values: Sequence[float]) -> float | None:
    """Jain's index: 1.0 when all equal, 1/n when one gets everything."""
    if not values or not any(values):
        return None
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


def _cv(values: Sequence[float]) -> float | None:
    if len(values) < 2 or statistics.fmean(values) == 0:
        return None
    return statistics.pstdev(values) / statistics.fmean(values)


def summarize(
    records: Sequence[RequestRecord],
    *,
    duration_s: float | None = None,
    slo_ttft_s: float = 2.0,
    issued: int | None = None,
    node_ids: Sequence[str] = (),
    class_slos: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """``slo_ttft_s`` judges classes ``class_slos`` does not name (defaults: interactive
    1 s, batch 30 s)."""
    ok = [r for r in records if r.status in ("ok", "degraded")]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    e2es = [r.e2e for r in ok if r.e2e is not None]
    tpots = [r.tpot for r in ok if r.tpot is not None]
    if duration_s is None:
        ends = [r.arrival + (r.e2e or 0.0) for r in records]
        duration_s = max(ends) if ends else 0.0
    duration_s = max(duration_s, 1e-9)
    out_tokens = sum(r.output_tokens for r in ok)
    prompt_tokens = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    expected = sum(r.expected_cached_tokens for r in ok)
    per_node = Counter(r.node for r in ok if r.node)
    for n in node_ids:
        per_node.setdefault(n, 0)
    per_tenant: dict[str, float] = defaultdict(float)
    for r in ok:
        per_tenant[r.tenant] += r.output_tokens / duration_s
    for r in records:
        per_tenant.setdefault(r.tenant, 0.0)
    statuses = Counter(r.status for r in records)
    issued = issued if issued is not None else len(records)
    goodput = _goodput(
        ok, duration_s, DEFAULT_CLASS_SLOS if class_slos is None else class_slos, slo_ttft_s
    )
    return {
        "requests": issued,
        "completed": len(ok),
        "rejected": statuses.get("rejected", 0),
        "errors": statuses.get("error", 0),
        "degraded": statuses.get("degraded", 0),
        "queued": sum(1 for r in records if r.queued_s > 0),
        "lost": issued - len(records),
        "duration_s": duration_s,
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p90_s": percentile(ttfts, 90),
        "ttft_p99_s": percentile(ttfts, 99),
        "tpot_p50_s": percentile(tpots, 50),
        "e2e_p50_s": percentile(e2es, 50),
        "e2e_p99_s": percentile(e2es, 99),
        "throughput_rps": len(ok) / duration_s,
        "output_tokens_per_s": out_tokens / duration_s,
        **goodput,
        "slo_ttft_s": slo_ttft_s,
        "cache_hit_rate": cached / prompt_tokens if prompt_tokens else None,
        "predicted_hit_rate": expected / prompt_tokens if prompt_tokens else None,
        "prediction_accuracy": cached / expected if expected else None,
        "node_requests": dict(sorted(per_node.items())),
        "node_load_cv": _cv(list(per_node.values())),
        "tenant_output_tokens_per_s": dict(sorted(per_tenant.items())),
        "tenant_jain_fairness": jain_fairness(list(per_tenant.values())),
    }


_COLUMNS = (
    ("TTFT p50 (s)", "ttft_p50_s", "{:.3f}"),
    ("TTFT p90 (s)", "ttft_p90_s", "{:.3f}"),
    ("TTFT p99 (s)", "ttft_p99_s", "{:.3f}"),
    ("TPOT p50 (ms)", "tpot_p50_s", "ms"),
    ("E2E p50 (s)", "e2e_p50_s", "{:.2f}"),
    ("req/s", "throughput_rps", "{:.2f}"),
    ("out tok/s", "output_tokens_per_s", "{:.0f}"),
    ("goodput tok/s", "goodput_tokens_per_s", "{:.0f}"),
    ("goodput req/s", "goodput_rps", "{:.2f}"),
    ("hit rate", "cache_hit_rate", "pct"),
    ("predicted hit", "predicted_hit_rate", "pct"),
    ("load CV", "node_load_cv", "{:.2f}"),
    ("Jain", "tenant_jain_fairness", "{:.2f}"),
    ("queued", "queued", "{}"),
    ("rejected", "rejected", "{}"),
    ("degraded", "degraded", "{}"),
    ("lost", "lost", "{}"),
)


def format_value(value: Any, style: str) -> str:
    """A figure for a table: ``pct`` (a fraction as %), ``ms`` (seconds as ms) or a
    format string; None is a dash."""
    if value is None:
        return "–"
    if style == "pct":
        return f"{100 * value:.1f}%"
    if style == "ms":
        return f"{1000 * value:.1f}"
    return style.format(value)


def table_rows(
    results: Mapping[str, Mapping[str, Any]], baseline: str | None = None
) -> list[list[str]]:
    """Header then one formatted row per policy; with a baseline, TTFT p50 and
    throughput ratio columns."""
    head = ["policy"] + [c[0] for c in _COLUMNS]
    if baseline in results:
        head += ["TTFT p50 vs base", "tok/s vs base"]
    rows = [head]
    base = results.get(baseline) if baseline else None
    for name, r in results.items():
        row = [name] + [format_value(r.get(key), style) for _, key, style in _COLUMNS]
        if base is not None:
            row.append(_ratio(r.get("ttft_p50_s"), base.get("ttft_p50_s")))
            row.append(_ratio(r.get("output_tokens_per_s"), base.get("output_tokens_per_s")))
        rows.append(row)
    return rows


def _ratio(value: Any, base: Any) -> str:
    return f"{value / base:.2f}x" if base and value is not None else "–"


def markdown_table(results: Mapping[str, Mapping[str, Any]], baseline: str | None = None) -> str:
    """Policies as rows; with a baseline, a TTFT p50 and throughput ratio column."""
    head, *rows = table_rows(results, baseline)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
