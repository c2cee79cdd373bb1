"""PNG of a ramp: p99 latency and throughput vs concurrency, the knee marked."""

from __future__ import annotations

from pathlib import Path

from kvgate.calibrate.ramp import RampResult


def write_plot(result: RampResult, path: str | Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = result.sorted_steps()
    xs = [s.concurrency for s in steps]
    source = steps[0].latency_source if steps else "client"
    fig, (lat, thr) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    lat.plot(xs, [s.ttft_p99 for s in steps], "o-", label=f"p99 TTFT ({source})")
    lat.plot(xs, [s.tpot_p99 for s in steps], "s--", label=f"p99 TPOT ({source})")
    if result.config.rule.slo_ttft_p99 is not None:
        lat.axhline(result.config.rule.slo_ttft_p99, color="grey", ls=":", label="TTFT SLO")
    lat.set_yscale("log")
    lat.set_ylabel("seconds")
    lat.legend(loc="lower right")
    thr.plot(xs, [s.throughput for s in steps], "o-", color="tab:green", label="output tok/s")
    thr.set_ylabel("output tokens / s (wall)")
    thr.set_xlabel("concurrency")
    rt = thr.twinx()
    rt.plot(xs, [s.runtime_tokens for s in steps], "^:", color="tab:purple", label="runtime tokens")
    rt.set_ylabel("runtime tokens (engine)")
    knee = result.knee_step
    if knee is not None:
        for ax in (lat, thr):
            ax.axvline(knee.concurrency, color="tab:red", ls="--")
        lat.annotate(
            f"knee: c={knee.concurrency}\n{knee.runtime_tokens:,.0f} runtime tokens"
            f"\n({result.knee.reason} past it)",
            xy=(knee.concurrency, knee.ttft_p99),
            xytext=(12, -45),
            textcoords="offset points",
            color="tab:red",
        )
    handles = thr.get_legend_handles_labels()[0] + rt.get_legend_handles_labels()[0]
    thr.legend(handles, [str(h.get_label()) for h in handles], loc="upper left")
    fig.suptitle(title or f"kvgate calibrate: {result.model}, context {result.config.context}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
