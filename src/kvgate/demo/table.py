"""The demo's closing comparison: two runs' summaries side by side, 80 columns wide."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.table import Table

from kvgate.report.summary import format_value

# (label, summary key, kvgate.report.summary.format_value style)
ROWS: tuple[tuple[str, str, str], ...] = (
    ("TTFT p50 (ms)", "ttft_p50_s", "ms"),
    ("TTFT p99 (ms)", "ttft_p99_s", "ms"),
    ("TTFT p99 interactive (ms)", "interactive_ttft_p99_s", "ms"),
    ("output tok/s", "output_tokens_per_s", "{:,.1f}"),
    ("token hit rate", "cache_hit_rate", "pct"),
    ("completed", "completed", "{:,}"),
    ("rejected (429/408/503)", "rejected", "{:,}"),
    ("errors", "errors", "{:,}"),
)


def ratio(new: Any, base: Any) -> float | None:
    if new is None or base is None or base == 0:
        return None
    return round(new / base, 3)


def comparison_rows(
    base_label: str, baseline: Mapping[str, Any], label: str, candidate: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """One dict per metric: both values and candidate / baseline."""
    return [
        {
            "metric": name,
            base_label: baseline.get(key),
            label: candidate.get(key),
            "ratio": ratio(candidate.get(key), baseline.get(key)),
        }
        for name, key, _ in ROWS
    ]


def comparison_table(
    base_label: str, baseline: Mapping[str, Any], label: str, candidate: Mapping[str, Any]
) -> Table:
    table = Table(title=f"{label} vs {base_label}, same workload and engines")
    table.add_column("metric")
    table.add_column(base_label, justify="right")
    table.add_column(label, justify="right")
    table.add_column("ratio", justify="right")
    for name, key, style in ROWS:
        base, new = baseline.get(key), candidate.get(key)
        r = ratio(new, base)
        table.add_row(
            name,
            format_value(base, style),
            format_value(new, style),
            "–" if r is None else f"{r:.2f}x",
        )
    return table
