"""JSON, CSV, Markdown and PNG plots of a comparison."""

from __future__ import annotations

import csv
import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kvgate.report.records import RequestRecord
from kvgate.report.summary import markdown_table, table_rows


def _plot_ttft_cdf(path: Path, records: Mapping[str, Sequence[RequestRecord]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, recs in records.items():
        values = sorted(r.ttft for r in recs if r.ttft is not None)
        if values:
            ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=name)
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("TTFT CDF")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_series(
    path: Path, series: Mapping[str, Mapping[str, Sequence[tuple[float, float]]]], ylabel: str
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(1, len(series))
    fig, axes = plt.subplots(n, 1, figsize=(7, 2.6 * n), squeeze=False, sharex=True)
    for ax, (policy, lines) in zip(axes[:, 0], series.items(), strict=False):
        for label, points in lines.items():
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], label=label, lw=1)
        ax.set_title(policy)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if 0 < len(lines) <= 12 and any(lines.values()):
            ax.legend(fontsize=6, ncol=4)
    axes[-1, 0].set_xlabel("time (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _html_page(
    title: str, meta: Mapping[str, Any], rows: list[list[str]], images: list[tuple[str, str]]
) -> str:
    esc = html.escape
    head, *body = rows
    table = "<tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>"
    table += "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in body)
    setup = "".join(f"<li><b>{esc(str(k))}</b>: {esc(str(v))}</li>" for k, v in meta.items())
    figures = "".join(
        f'<figure><img alt="{esc(alt)}" src="{esc(src)}"><figcaption>{esc(alt)}</figcaption>'
        "</figure>"
        for alt, src in images
    )
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>{esc(title)}</title><style>
body {{ font: 15px/1.5 system-ui, sans-serif; max-width: 1100px; margin: 24px auto; padding: 0 16px; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ccc; padding: 4px 8px; }}
td {{ text-align: right; }} td:first-child {{ text-align: left; }} img {{ max-width: 100%; }}
</style></head><body><h1>{esc(title)}</h1><ul>{setup}</ul><table>{table}</table>{figures}
<p>Raw figures: <code>results.json</code>, <code>requests.csv</code> next to this file.</p>
</body></html>
"""


def write_report(
    out_dir: str | Path,
    results: Mapping[str, Mapping[str, Any]],
    records: Mapping[str, Sequence[RequestRecord]],
    title: str,
    *,
    meta: Mapping[str, Any] | None = None,
    node_load: Mapping[str, Mapping[str, Sequence[tuple[float, float]]]] | None = None,
    hit_rate: Mapping[str, Mapping[str, Sequence[tuple[float, float]]]] | None = None,
    baseline: str | None = None,
    quota: Mapping[str, Mapping[str, Sequence[tuple[float, float]]]] | None = None,
) -> list[Path]:
    """Write results.json, results.csv, requests.csv, report.md, report.html and plots;
    return the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    doc = {"title": title, "meta": dict(meta or {}), "results": results}
    (out / "results.json").write_text(json.dumps(doc, indent=2, sort_keys=True))
    written.append(out / "results.json")
    scalar_keys = sorted(
        {k for r in results.values() for k, v in r.items() if not isinstance(v, dict)}
    )
    with (out / "results.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["policy", *scalar_keys])
        for name, r in results.items():
            w.writerow([name, *[r.get(k) for k in scalar_keys]])
    written.append(out / "results.csv")
    with (out / "requests.csv").open("w", newline="") as f:
        fields = list(RequestRecord.__dataclass_fields__)
        w2 = csv.DictWriter(f, fieldnames=["policy", *fields])
        w2.writeheader()
        for name, recs in records.items():
            for rec in recs:
                w2.writerow({"policy": name, **asdict(rec)})
    written.append(out / "requests.csv")
    table = markdown_table(results, baseline=baseline)
    md = [f"# {title}", ""]
    for k, v in (meta or {}).items():
        md.append(f"- {k}: {v}")
    md += ["", table, ""]
    _plot_ttft_cdf(out / "ttft_cdf.png", records)
    written.append(out / "ttft_cdf.png")
    images = [("TTFT CDF", "ttft_cdf.png")]
    if node_load:
        _plot_series(out / "node_load.png", node_load, "running + waiting")
        written.append(out / "node_load.png")
        images.append(("load per node", "node_load.png"))
    if hit_rate:
        _plot_series(out / "hit_rate.png", hit_rate, "token hit rate")
        written.append(out / "hit_rate.png")
        images.append(("hit rate over time", "hit_rate.png"))
    if quota:
        _plot_series(out / "quota.png", quota, "runtime tokens")
        written.append(out / "quota.png")
        images.append(("quota total vs use over time", "quota.png"))
    md += [f"![{alt}]({src})" for alt, src in images]
    (out / "report.md").write_text("\n".join(md) + "\n")
    written.append(out / "report.md")
    rows = table_rows(results, baseline)
    (out / "report.html").write_text(_html_page(title, meta or {}, rows, images))
    written.append(out / "report.html")
    return written
