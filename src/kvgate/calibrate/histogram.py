"""Quantiles from the difference of two scrapes of a Prometheus histogram."""

from __future__ import annotations

import math

from kvgate.adapters.prom import MetricSet

# TTFT / TPOT histogram names by engine, first present wins (names change across versions).
TTFT_HISTOGRAMS = (
    "vllm:time_to_first_token_seconds",
    "sglang:time_to_first_token_seconds",
)
TPOT_HISTOGRAMS = (
    "vllm:time_per_output_token_seconds",
    "vllm:inter_token_latency_seconds",
    "sglang:time_per_output_token_seconds",
    "sglang:inter_token_latency_seconds",
)


def buckets(metrics: MetricSet, names: tuple[str, ...]) -> dict[float, float] | None:
    """Cumulative bucket counts (``le`` → count, summed over label sets) of the first name."""
    for name in names:
        samples = metrics.get(f"{name}_bucket")
        if not samples:
            continue
        out: dict[float, float] = {}
        for s in samples:
            le = s.labels.get("le")
            if le is None:
                continue
            bound = math.inf if le in ("+Inf", "inf", "Inf") else float(le)
            out[bound] = out.get(bound, 0.0) + s.value
        return out or None
    return None


def delta_quantile(
    before: dict[float, float] | None, after: dict[float, float] | None, q: float
) -> float | None:
    """The q-quantile of observations made between two scrapes (linear within a bucket).

    None when either scrape lacks the histogram or nothing was observed in between.
    Above the last finite bucket the answer is that bucket's bound (as Prometheus'
    ``histogram_quantile`` does).
    """
    if before is None or after is None:
        return None
    bounds = sorted(after)
    counts = [max(0.0, after[b] - before.get(b, 0.0)) for b in bounds]
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return None
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if count >= rank:
            if math.isinf(bound):
                return prev_bound
            width = count - prev_count
            frac = (rank - prev_count) / width if width > 0 else 1.0
            return prev_bound + (bound - prev_bound) * frac
        prev_bound, prev_count = bound, count
    return prev_bound


def delta_mean(
    before: MetricSet | None, after: MetricSet | None, names: tuple[str, ...]
) -> float | None:
    """Mean of the observations made between two scrapes (exact: _sum and _count deltas)."""
    if before is None or after is None:
        return None
    for name in names:
        s0, s1 = before.total(f"{name}_sum"), after.total(f"{name}_sum")
        c0, c1 = before.total(f"{name}_count"), after.total(f"{name}_count")
        if None in (s0, s1, c0, c1):
            continue
        assert s0 is not None and s1 is not None and c0 is not None and c1 is not None
        if c1 - c0 <= 0:
            return None
        return max(0.0, (s1 - s0) / (c1 - c0))
    return None
