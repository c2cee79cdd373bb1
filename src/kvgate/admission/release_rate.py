"""The measured release rate (tokens/s over a window), which sizes Retry-After."""

from __future__ import annotations

import math
from collections import deque

RATE_WINDOW_S = 30.0
MAX_RETRY_AFTER_S = 60.0


class ReleaseRate:
    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self._releases: deque[tuple[float, int]] = deque()
        self._first_seen: float | None = None

    def seen(self, now: float) -> None:
        if self._first_seen is None:
            self._first_seen = now

    def _trim(self, now: float) -> None:
        while self._releases and self._releases[0][0] < now - self.window_s:
            self._releases.popleft()

    def record(self, now: float, tokens: int) -> None:
        self._releases.append((now, tokens))
        self._trim(now)

    def rate(self, now: float) -> float:
        """Tokens released per second over the recent window."""
        self._trim(now)
        if not self._releases or self._first_seen is None:
            return 0.0
        span = max(1.0, now - max(now - self.window_s, self._first_seen))
        return sum(t for _, t in self._releases) / span

    def retry_after(self, backlog_tokens: int, now: float, fallback_s: float) -> float:
        """Seconds until ``backlog_tokens`` are likely released (1..60 s)."""
        rate = self.rate(now)
        if rate <= 0:
            return min(MAX_RETRY_AFTER_S, fallback_s)
        return float(min(MAX_RETRY_AFTER_S, max(1.0, math.ceil(backlog_tokens / rate))))
