"""The retry budget: retries may be at most a fraction of requests over a sliding window.

Without it, a failing cluster turns every request into ``1 + max_retries`` upstream
calls exactly when capacity is lowest (a retry storm). ``min_retries`` lets a quiet
gateway still retry a few requests.
"""

from __future__ import annotations

from collections import deque


class RetryBudget:
    def __init__(self, *, ratio: float, window_s: float, min_retries: int) -> None:
        self.ratio = ratio
        self.window_s = window_s
        self.min_retries = min_retries
        self._requests: deque[float] = deque()
        self._retries: deque[float] = deque()

    def _trim(self, now: float) -> None:
        oldest = now - self.window_s
        for times in (self._requests, self._retries):
            while times and times[0] < oldest:
                times.popleft()

    def record_request(self, now: float) -> None:
        self._requests.append(now)

    def allowed(self, now: float) -> int:
        """Retries the budget holds over the current window."""
        self._trim(now)
        return max(self.min_retries, int(self.ratio * len(self._requests)))

    def try_spend(self, now: float) -> bool:
        """Take one retry from the budget; False (nothing taken) when it is spent."""
        if len(self._retries) >= self.allowed(now):
            return False
        self._retries.append(now)
        return True

    def spent(self, now: float) -> int:
        self._trim(now)
        return len(self._retries)
