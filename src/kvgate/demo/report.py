"""The demo's HTML report: the comparison table and matplotlib plots embedded as PNGs."""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvgate.demo.results import PolicyResult, comparison


def _png(fig: Any) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode()


def _plots(results: Sequence[PolicyResult]) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots = []
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for r in results:
        values = sorted(r.ttfts_ms)
        if values:
            ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=r.policy)
    ax.set_xscale("log")
    ax.set_xlabel("time to first token (ms, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.grid(alpha=0.3)
    ax.legend()
    plots.append(("TTFT distribution (CDF)", _png(fig)))
    plt.close(fig)

    fig, axes = plt.subplots(1, 3, figsize=(9.6, 3.2))
    names = [r.policy for r in results]
    series = (
        ("token hit rate (%)", [100 * (r.token_hit_rate or 0) for r in results]),
        ("throughput (output tok/s)", [r.throughput_tok_s for r in results]),
        ("TTFT p99 (ms)", [r.ttft_p99_ms or 0 for r in results]),
    )
    for ax, (title, values) in zip(axes, series, strict=True):
        ax.bar(names, values, color=["#8b97a5", "#3f7fd9"][: len(values)])
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    plots.append(("Headline figures", _png(fig)))
    plt.close(fig)

    fig, axes = plt.subplots(1, len(results), figsize=(4.8 * len(results), 3.2), squeeze=False)
    for ax, r in zip(axes[0], results, strict=True):
        ax.bar(list(r.per_node), list(r.per_node.values()), color="#3fb950")
        ax.set_title(f"requests per node — {r.policy}", fontsize=10)
        ax.tick_params(axis="x", labelrotation=30)
    fig.tight_layout()
    plots.append(("Where requests went", _png(fig)))
    plt.close(fig)
    return plots


def write_report(
    out_dir: Path, baseline: PolicyResult, candidate: PolicyResult, meta: dict[str, Any]
) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = comparison(baseline, candidate)
    data = {"meta": meta, "results": [baseline.as_json(), candidate.as_json()], "comparison": rows}
    (out_dir / "results.json").write_text(json.dumps(data, indent=2))
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in rows[0])
    body = "".join(
        "<tr>"
        + "".join(f"<td>{html.escape('—' if v is None else str(v))}</td>" for v in row.values())
        + "</tr>"
        for row in rows
    )
    figures = "".join(
        f'<figure><img alt="{html.escape(title)}" src="data:image/png;base64,{png}">'
        f"<figcaption>{html.escape(title)}</figcaption></figure>"
        for title, png in _plots([baseline, candidate])
    )
    setup = "".join(
        f"<li><b>{html.escape(k)}</b>: {html.escape(str(v))}</li>" for k, v in meta.items()
    )
    page = f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>kvgate demo report</title><style>
body {{ font: 15px/1.5 system-ui, sans-serif; max-width: 1000px; margin: 24px auto; padding: 0 16px; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ccc; padding: 4px 10px; text-align: right; }}
td:first-child, th:first-child {{ text-align: left; }} figure {{ margin: 18px 0; }}
img {{ max-width: 100%; }} figcaption {{ color: #555; }}
</style></head><body>
<h1>kvgate demo: {html.escape(candidate.policy)} vs {html.escape(baseline.policy)}</h1>
<p>The same generated workload was replayed against the same simulated engines (restarted
with empty caches before each run), first through <code>{html.escape(baseline.policy)}</code>
(admission {"on" if baseline.admission else "off"}), then through
<code>{html.escape(candidate.policy)}</code> (admission {"on" if candidate.admission else "off"}).
Ratios are {html.escape(candidate.policy)} / {html.escape(baseline.policy)}. Latency
and throughput figures count completed requests only; requests admission rejected (429,
or 408 after a queue deadline) appear in the "rejected" row, not in the latencies.</p>
<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>
{figures}
<h2>Setup</h2><ul>{setup}</ul>
<p>Raw figures: <code>results.json</code> next to this file.</p>
</body></html>
"""
    path = out_dir / "index.html"
    path.write_text(page)
    return path
