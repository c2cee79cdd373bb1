"""The runtime-token ledger: what each in-flight request holds, and output estimates.

Held tokens = prompt + tokens generated so far; the reservation at admission is
prompt + estimated output, where the estimate is max_tokens capped by the tenant's
learned completion-length percentile. Queued requests count their prefill tokens.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass


class StreamingQuantile:
    """A quantile over the last ``window`` observations (sorted window, O(window))."""

    def __init__(self, q: float, window: int) -> None:
        self.q = q
        self._recent: deque[int] = deque(maxlen=window)
        self._sorted: list[int] = []

    def add(self, value: int) -> None:
        if len(self._recent) == self._recent.maxlen:
            old = self._recent[0]
            del self._sorted[bisect.bisect_left(self._sorted, old)]
        self._recent.append(value)
        bisect.insort(self._sorted, value)

    def __len__(self) -> int:
        return len(self._sorted)

    def value(self) -> int | None:
        if not self._sorted:
            return None
        index = min(len(self._sorted) - 1, int(self.q * len(self._sorted)))
        return self._sorted[index]


@dataclass(slots=True)
class LedgerEntry:
    request_id: str
    tenant: str
    prompt_tokens: int
    reserved: int
    generated: int = 0

    @property
    def held(self) -> int:
        return self.prompt_tokens + self.generated


class Ledger:
    MIN_OBSERVATIONS = 20

    def __init__(
        self,
        percentile: float = 0.9,
        window: int = 512,
        engine_usage: Callable[[], int | None] | None = None,
    ) -> None:
        self._percentile = percentile
        self._window = window
        self._estimators: dict[str, StreamingQuantile] = {}
        self._entries: dict[str, LedgerEntry] = {}
        self.queued_prefill = 0
        self.engine_usage = engine_usage

    def estimate_output(self, tenant: str, max_tokens: int) -> int:
        est = self._estimators.get(tenant)
        if est is None or len(est) < self.MIN_OBSERVATIONS:
            return max_tokens
        learned = est.value()
        return max_tokens if learned is None else min(max_tokens, max(1, learned))

    def reservation_for(self, tenant: str, prompt_tokens: int, max_tokens: int) -> int:
        return prompt_tokens + self.estimate_output(tenant, max_tokens)

    def open(self, request_id: str, tenant: str, prompt_tokens: int, reserved: int) -> LedgerEntry:
        entry = LedgerEntry(request_id, tenant, prompt_tokens, reserved)
        self._entries[request_id] = entry
        return entry

    def progress(self, request_id: str, generated: int) -> int:
        """Record generated tokens; returns how far the reservation must grow (>= 0)."""
        entry = self._entries.get(request_id)
        if entry is None:
            return 0
        entry.generated = max(entry.generated, generated)
        grow = entry.held - entry.reserved
        if grow > 0:
            entry.reserved += grow
            return grow
        return 0

    def close(self, request_id: str) -> LedgerEntry | None:
        entry = self._entries.pop(request_id, None)
        if entry is not None and entry.generated > 0:
            est = self._estimators.get(entry.tenant)
            if est is None:
                est = self._estimators[entry.tenant] = StreamingQuantile(
                    self._percentile, self._window
                )
            est.add(entry.generated)
        return entry

    @property
    def reserved_total(self) -> int:
        return sum(e.reserved for e in self._entries.values())

    @property
    def held_total(self) -> int:
        """Runtime tokens: held by active requests plus prefill of queued ones."""
        return sum(e.held for e in self._entries.values()) + self.queued_prefill

    def watermark(self) -> int:
        """The larger of the ledger and engine-reported KV use (tokens)."""
        engine = self.engine_usage() if self.engine_usage is not None else None
        return max(self.held_total, engine or 0)

    def mean_request_tokens(self) -> float:
        if not self._entries:
            return 0.0
        return self.reserved_total / len(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
