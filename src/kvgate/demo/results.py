"""Per-policy figures from request records, and the side-by-side comparison table."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.table import Table

from kvgate.demo.load import RequestRecord


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass
class PolicyResult:
    policy: str
    admission: bool
    wall_s: float
    requests: int
    ok: int
    rejected: int  # 429 and 408 (queue deadline)
    errors: int
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    throughput_tok_s: float
    token_hit_rate: float | None
    interactive_ttft_p99_ms: float | None = None
    per_node: dict[str, int] = field(default_factory=dict)
    per_tenant_ok: dict[str, int] = field(default_factory=dict)
    admission_headers: dict[str, int] = field(default_factory=dict)
    ttfts_ms: list[float] = field(default_factory=list, repr=False)

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("ttfts_ms")
        return data


def summarise(
    policy: str, admission: bool, records: Sequence[RequestRecord], wall_s: float
) -> PolicyResult:
    ok = [r for r in records if r.status == 200 and r.error is None]
    ttfts = [r.ttft_s * 1000 for r in ok if r.ttft_s is not None]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    p50, p99 = percentile(ttfts, 0.5), percentile(ttfts, 0.99)
    interactive = percentile(
        [r.ttft_s * 1000 for r in ok if r.ttft_s is not None and r.tenant == "interactive"], 0.99
    )
    return PolicyResult(
        policy=policy,
        admission=admission,
        wall_s=round(wall_s, 2),
        requests=len(records),
        ok=len(ok),
        rejected=sum(1 for r in records if r.status in (408, 429)),
        errors=sum(
            1 for r in records if r.status not in (200, 408, 429) or (r.error and r.status == 200)
        ),
        ttft_p50_ms=None if p50 is None else round(p50, 1),
        ttft_p99_ms=None if p99 is None else round(p99, 1),
        throughput_tok_s=round(sum(r.completion_tokens for r in ok) / wall_s, 1) if wall_s else 0.0,
        token_hit_rate=round(cached / prompt, 4) if prompt else None,
        interactive_ttft_p99_ms=None if interactive is None else round(interactive, 1),
        per_node=dict(sorted(Counter(r.node or "?" for r in ok).items())),
        per_tenant_ok=dict(sorted(Counter(r.tenant for r in ok).items())),
        admission_headers=dict(
            sorted(Counter((r.admission or "none").split(";")[0] for r in records).items())
        ),
        ttfts_ms=ttfts,
    )


def ratio(new: float | None, base: float | None) -> float | None:
    if new is None or base is None or base == 0:
        return None
    return round(new / base, 3)


ROWS: tuple[tuple[str, str, str], ...] = (
    ("TTFT p50 (ms)", "ttft_p50_ms", "lower is better"),
    ("TTFT p99 (ms)", "ttft_p99_ms", "lower is better"),
    ("TTFT p99, interactive tenant (ms)", "interactive_ttft_p99_ms", "lower is better"),
    ("throughput (output tok/s)", "throughput_tok_s", "higher is better"),
    ("token hit rate", "token_hit_rate", "higher is better"),
    ("completed requests", "ok", ""),
    ("rejected (429/408)", "rejected", "admission at work"),
    ("errors", "errors", ""),
)


def comparison(baseline: PolicyResult, candidate: PolicyResult) -> list[dict[str, Any]]:
    rows = []
    for label, attr, note in ROWS:
        base, new = getattr(baseline, attr), getattr(candidate, attr)
        rows.append({"metric": label, baseline.policy: base, candidate.policy: new,
                     "ratio": ratio(new, base), "note": note})  # fmt: skip
    return rows


def _fmt(value: Any, attr: str) -> str:
    if value is None:
        return "—"
    if attr == "token_hit_rate":
        return f"{value * 100:.1f}%"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return f"{value:,}"


def comparison_table(baseline: PolicyResult, candidate: PolicyResult) -> Table:
    table = Table(title=f"{candidate.policy} vs {baseline.policy} — same workload, same engines")
    table.add_column("metric")
    table.add_column(baseline.policy, justify="right")
    table.add_column(
        candidate.policy + (" + admission" if candidate.admission else ""), justify="right"
    )
    table.add_column(f"{candidate.policy}/{baseline.policy}", justify="right")
    table.add_column("", style="dim")
    for label, attr, note in ROWS:
        base, new = getattr(baseline, attr), getattr(candidate, attr)
        r = ratio(new, base)
        table.add_row(
            label, _fmt(base, attr), _fmt(new, attr), "—" if r is None else f"{r:.2f}×", note
        )
    return table
