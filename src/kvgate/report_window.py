"""Sliding-window smoothing of node reports, shared by the gateway's node view and the sidecar.

Gauges (running, waiting, KV usage) are averaged over the window; counters are kept as
the latest value; the prefix hit rate is recomputed from counter deltas when the adapter
supplies ``extra["prefix_queries_total"]`` / ``extra["prefix_hits_total"]``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

from kvgate.types import NodeReport

_GAUGES = ("running", "waiting", "kv_usage", "prompt_tokens_rate", "generation_tokens_rate")


class ReportWindow:
    def __init__(self, window_s: float = 15.0, max_samples: int = 32) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be positive")
        self.window_s = window_s
        self._samples: deque[NodeReport] = deque(maxlen=max_samples)

    def clear(self) -> None:
        self._samples.clear()

    def add(self, report: NodeReport) -> NodeReport:
        """Add a fresh report and return the smoothed view (stale reports are not averaged)."""
        if report.counters_reset:
            self._samples.clear()
        if not report.stale:
            self._samples.append(report)
        cutoff = report.timestamp - self.window_s
        while self._samples and self._samples[0].timestamp < cutoff:
            self._samples.popleft()
        return self.smoothed(report)

    def smoothed(self, latest: NodeReport) -> NodeReport:
        fresh = [s for s in self._samples if not s.stale]
        if not fresh:
            return latest
        n = len(fresh)
        values = {g: sum(getattr(s, g) for s in fresh) / n for g in _GAUGES}
        out = replace(latest, **values) if not latest.stale else replace(latest)
        first, last = fresh[0], fresh[-1]
        q0, q1 = first.extra.get("prefix_queries_total"), last.extra.get("prefix_queries_total")
        h0, h1 = first.extra.get("prefix_hits_total"), last.extra.get("prefix_hits_total")
        if None not in (q0, q1, h0, h1) and len(fresh) >= 2:
            dq = float(q1) - float(q0)  # type: ignore[arg-type]
            dh = float(h1) - float(h0)  # type: ignore[arg-type]
            if dq > 0:
                out.prefix_hit_rate = max(0.0, min(1.0, dh / dq))
        return out
