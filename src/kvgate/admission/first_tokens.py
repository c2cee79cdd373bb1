"""Recent first-token latencies per priority class (admission → first token).

The dynamic quota loop reads their percentile over its last period: it is the part of
TTFT the total controls (queueing and prefill in the engines), measured by the gateway
itself from the stream's first content-bearing chunk (``pipeline.first_token``).
"""

from __future__ import annotations

from collections import deque


class FirstTokenWindow:
    def __init__(self, horizon_s: float = 120.0) -> None:
        self.horizon_s = horizon_s
        self._seen: dict[str, deque[tuple[float, float]]] = {}  # (admitted at, latency)

    def observe(self, now: float, priority_class: str, seconds: float) -> None:
        window = self._seen.setdefault(priority_class, deque())
        window.append((now - seconds, seconds))
        while window and window[0][0] < now - self.horizon_s:
            window.popleft()

    def quantile(
        self,
        priority_class: str,
        q: float,
        since: float,
        settle_s: float = 0.0,
        *,
        now: float | None = None,
        pending: list[float] = (),  # type: ignore[assignment]
    ) -> tuple[float | None, int]:
        """(q-th percentile, q in 0..100, of requests admitted after ``since``; how many).

        Counting by admission time keeps a period's figure to work admitted under the
        total being judged, not to a backlog left by the one before. ``pending`` are the
        admission times of requests still waiting for their first token: each counts
        as at least ``now - admitted`` — without them, a congested period would be judged
        only by its requests that were quick enough to answer before the step."""
        seen = [(t, s) for t, s in self._seen.get(priority_class, ()) if t >= since]
        if now is not None:
            seen += [(t, now - t) for t in pending if t >= since]
        if seen and settle_s > 0:
            # the first admissions after a change come in a burst (a shrunk total first
            # waits for the old reservations to drain): judge what follows it
            start = min(t for t, _ in seen) + settle_s
            seen = [(t, s) for t, s in seen if t >= start]
        values = sorted(s for _, s in seen)
        if not values:
            return None, 0
        return values[min(len(values) - 1, int(q / 100 * len(values)))], len(values)
