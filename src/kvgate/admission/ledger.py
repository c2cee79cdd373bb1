"""The runtime-token ledger: what each in-flight request reserved and holds.

A reservation is prompt + the request's output bound, fixed at admission. Held tokens
are prompt + tokens generated so far (what the engine's KV really carries). Queued
requests count their prefill tokens. Degraded work is entered like any other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class LedgerEntry:
    request_id: str
    tenant: str
    prompt_tokens: int
    reserved: int
    mode: str = "normal"  # normal | low_priority | economy_pool | async
    priority_class: str = "interactive"
    admitted_at: float = 0.0
    stream: bool = False
    generated: int = 0

    @property
    def held(self) -> int:
        return self.prompt_tokens + self.generated


class Ledger:
    def __init__(self, engine_usage: Callable[[], int | None] | None = None) -> None:
        self._entries: dict[str, LedgerEntry] = {}
        self.queued_prefill = 0
        self.engine_usage = engine_usage

    def open(
        self,
        request_id: str,
        tenant: str,
        prompt_tokens: int,
        reserved: int,
        mode: str,
        priority_class: str = "interactive",
        admitted_at: float = 0.0,
        stream: bool = False,
    ) -> LedgerEntry:
        entry = LedgerEntry(
            request_id, tenant, prompt_tokens, reserved, mode, priority_class, admitted_at, stream
        )
        self._entries[request_id] = entry
        return entry

    def progress(self, request_id: str, generated: int) -> int:
        """Record generated tokens; returns how many run past the reservation (>= 0)."""
        entry = self._entries.get(request_id)
        if entry is None:
            return 0
        before = max(0, entry.held - entry.reserved)
        entry.generated = max(entry.generated, generated)
        return max(0, entry.held - entry.reserved) - before

    def close(self, request_id: str) -> LedgerEntry | None:
        return self._entries.pop(request_id, None)

    @property
    def reserved_total(self) -> int:
        return sum(e.reserved for e in self._entries.values())

    def reserved_by(self) -> dict[tuple[str, str], int]:
        """Reserved tokens per (tenant, mode)."""
        out: dict[tuple[str, str], int] = {}
        for e in self._entries.values():
            out[(e.tenant, e.mode)] = out.get((e.tenant, e.mode), 0) + e.reserved
        return out

    @property
    def held_total(self) -> int:
        """Runtime tokens: held by active requests plus prefill of queued ones."""
        return sum(e.held for e in self._entries.values()) + self.queued_prefill

    def engine_tokens(self) -> int | None:
        return self.engine_usage() if self.engine_usage is not None else None

    def watermark(self) -> int:
        """The larger of the ledger and engine-reported KV use (tokens)."""
        return max(self.held_total, self.engine_tokens() or 0)

    def mean_request_tokens(self) -> float:
        if not self._entries:
            return 0.0
        return self.reserved_total / len(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def waiting_first_token(self, priority_class: str) -> list[float]:
        """Admission times of in-flight streams of a class with no token generated yet."""
        return [
            e.admitted_at
            for e in self._entries.values()
            if e.stream and e.priority_class == priority_class and e.generated == 0
        ]

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._entries
