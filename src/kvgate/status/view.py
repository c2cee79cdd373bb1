"""Rich tables for an admin summary; shared by ``kvgate status`` and the demo's live view."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

ADMISSION_KINDS = ("admit", "queue", "reject", "degrade")
_STATE_STYLE = {
    "healthy": "green",
    "backoff": "yellow",
    "quiescing": "cyan",
    "re-register": "magenta",
    "unreachable": "red",
}
DASH = "—"


def _is_num(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def fmt_int(value: Any) -> str:
    return f"{round(value):,}" if _is_num(value) else DASH


def fmt_pct(value: Any) -> str:
    return f"{value * 100:.1f}%" if _is_num(value) else DASH


def fmt_num(value: Any, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if _is_num(value) else DASH


def gateway_line(summary: Mapping[str, Any]) -> Text:
    g = summary.get("gateway") or {}
    flags = g.get("flags") or {}
    off = sorted(name for name, on in flags.items() if not on)
    line = Text()
    line.append("gateway ", style="dim").append(str(g.get("id", DASH)), style="bold")
    line.append("  policy ", style="dim").append(str(g.get("policy", DASH)), style="bold")
    line.append("  store ", style="dim").append(str(g.get("store", DASH)))
    line.append("  uptime ", style="dim").append(f"{fmt_num(g.get('uptime_s'), 0)} s")
    line.append("  auth ", style="dim").append("API keys" if g.get("auth_enabled") else "off")
    line.append("  flags off ", style="dim").append(", ".join(off) if off else "none")
    return line


# Columns of the nodes table; ``narrow`` marks those kept in an 80-column view.
_NODE_COLUMNS: tuple[tuple[str, bool], ...] = (
    ("node", True),
    ("state", True),
    ("model", False),
    ("running", True),
    ("waiting", True),
    ("in flight", False),
    ("load", True),
    ("KV usage", True),
    ("pred. hit", True),
    ("actual hit", True),
    ("cold boost", False),
    ("report age", False),
    ("capacity", False),
)


def nodes_table(summary: Mapping[str, Any], *, narrow: bool = False) -> Table:
    """Every node's state and load; ``narrow`` keeps the columns that fit 80 columns."""
    keep = [not narrow or fits for _, fits in _NODE_COLUMNS]
    table = Table(title="Nodes", title_justify="left", expand=False)
    for (name, _), shown in zip(_NODE_COLUMNS, keep, strict=True):
        if shown:
            table.add_column(
                name, justify="left" if name in ("node", "state", "model") else "right"
            )
    for n in summary.get("nodes") or []:
        state = str(n.get("state") or "?")
        cells: tuple[str | Text, ...] = (
            str(n.get("node_id")),
            Text(state, style=_STATE_STYLE.get(state, "")),
            f"{n.get('model') or DASH} / {n.get('pool') or DASH}",
            fmt_int(n.get("running")),
            fmt_int(n.get("waiting")),
            fmt_int(n.get("inflight_requests")),
            fmt_num(n.get("load")),
            fmt_pct(n.get("kv_usage")),
            fmt_pct(n.get("predicted_hit_rate")),
            fmt_pct(n.get("actual_hit_rate")),
            fmt_num(n.get("cold_boost")),
            f"{fmt_num(n.get('report_age_s'), 1)} s" if _is_num(n.get("report_age_s")) else DASH,
            _capacity_cell(n),
        )
        table.add_row(*[c for c, shown in zip(cells, keep, strict=True) if shown])
    if not summary.get("nodes"):
        table.add_row("no nodes registered", *[""] * (sum(keep) - 1))
    return table


def _capacity_cell(n: Mapping[str, Any]) -> Text:
    """Calibrated capacity (runtime tokens), or a warning for a node without a profile."""
    if n.get("calibrated") is False:
        return Text("uncalibrated", style="bold yellow")
    return Text(fmt_int(n.get("capacity_tokens")))


def tenants_table(summary: Mapping[str, Any]) -> Table:
    admission = summary.get("admission") or {}
    caption = (
        f"cluster quota {fmt_int(admission.get('used'))} / {fmt_int(admission.get('total_quota'))}"
        " runtime tokens"
        if admission.get("enabled")
        else "admission off: every request is admitted"
    )
    table = Table(title="Tenants", title_justify="left", caption=caption, caption_justify="left")
    table.add_column("tenant")
    for name in ("guaranteed", "weight", "used", "hard cap", "queue"):
        table.add_column(name, justify="right")
    for t in summary.get("tenants") or []:
        table.add_row(
            str(t.get("name")),
            fmt_int(t.get("guaranteed")),
            fmt_num(t.get("weight"), 1),
            fmt_int(t.get("used")),
            fmt_int(t.get("hard_cap")),
            fmt_int(t.get("queue_depth")),
        )
    return table


def decision_counts(totals: Any) -> dict[str, float]:
    """``{kind: n}`` from the summary; a ``{kind: {reason: n}}`` breakdown is summed per kind."""
    counts: dict[str, float] = {}
    for kind, value in (totals or {}).items():
        if isinstance(value, Mapping):
            counts[str(kind)] = sum(v for v in value.values() if _is_num(v))
        elif _is_num(value):
            counts[str(kind)] = value
    return counts


def decision_rates(
    now: Mapping[str, Any], before: Mapping[str, Any] | None, seconds: float | None
) -> dict[str, float | None]:
    """Per-second rates from two cumulative counter snapshots (None without a baseline)."""
    rates: dict[str, float | None] = {}
    for kind, value in now.items():
        previous = (before or {}).get(kind)
        if seconds and seconds > 0 and _is_num(previous) and _is_num(value):
            rates[kind] = max(0.0, (value - previous) / seconds)
        else:
            rates[kind] = None
    return rates


def decisions_table(
    summary: Mapping[str, Any],
    previous: Mapping[str, Any] | None = None,
    seconds: float | None = None,
) -> Table:
    """Cumulative decision counts; with a previous summary also per-second rates."""
    table = Table(title="Decisions", title_justify="left")
    table.add_column("layer")
    table.add_column("kind")
    table.add_column("total", justify="right")
    with_rates = previous is not None
    if with_rates:
        table.add_column("per s", justify="right")
    for layer in ("admission", "routing"):
        totals = decision_counts((summary.get(layer) or {}).get("decisions_total"))
        if layer == "admission":
            totals = {k: totals.get(k, 0) for k in ADMISSION_KINDS} | totals
        before = decision_counts(((previous or {}).get(layer) or {}).get("decisions_total"))
        rates = decision_rates(totals, before, seconds)
        for kind in totals:
            row = [layer, kind, fmt_int(totals[kind])]
            if with_rates:
                row.append(fmt_num(rates[kind], 1))
            table.add_row(*row)
    return table


def cache_choice_line(summary: Mapping[str, Any]) -> Text:
    """Routing-decision quality: the share of decisions that took the node holding the
    longest cached prefix, and the cached tokens the others gave up, by route reason."""
    q = (summary.get("routing") or {}).get("cache_choice") or {}
    line = Text()
    line.append("best cached node ", style="dim")
    line.append(fmt_pct(q.get("took_best_share")), style="bold")
    line.append(f" of {fmt_int(q.get('decisions', 0))} decisions", style="dim")
    line.append(f" ({fmt_int(q.get('with_cached_prefix', 0))} with a cached prefix)", style="dim")
    line.append("  forgone ", style="dim").append(fmt_int(q.get("forgone_tokens", 0)))
    line.append(f" of {fmt_int(q.get('best_tokens', 0))} cached tokens", style="dim")
    by_reason = q.get("forgone_tokens_by_reason") or {}
    if by_reason:
        parts = ", ".join(f"{reason} {fmt_int(n)}" for reason, n in by_reason.items())
        line.append(f" ({parts})")
    return line


def summary_view(
    summary: Mapping[str, Any],
    previous: Mapping[str, Any] | None = None,
    seconds: float | None = None,
    *,
    narrow: bool = False,
) -> RenderableType:
    return Group(
        gateway_line(summary),
        nodes_table(summary, narrow=narrow),
        tenants_table(summary),
        decisions_table(summary, previous, seconds),
        cache_choice_line(summary),
    )
