"""What the picker learns from an engine's answer as Envoy streams it past.

A streamed answer is read as the gateway's byte path reads it (``kvgate.gateway.bytepath``):
cut at complete SSE events, generated tokens counted per content field, the first
content-bearing chunk reported at once (``kvgate.pipeline.first_token``), usage parsed
only from the event that carries it and, when kvgate asked for usage the client did
not, the injected ``"usage":null`` fields and the usage-only chunk removed. Complete
events leave at once; only an incomplete event's bytes wait for the rest. A
non-streamed answer is collected (up to a bound) and its ``usage`` read at the end;
its bytes pass through unchanged.
"""

from __future__ import annotations

import json

from kvgate.gateway.bytepath import count_generated, strip_null_usage, take_usage
from kvgate.gateway.usage import Usage, parse_usage
from kvgate.pipeline.first_token import ProgressSchedule, events_bear_content

MAX_UNARY_BYTES = 8 * 1024 * 1024  # a larger non-streamed answer passes without usage


class StreamObserver:
    """An SSE answer: ``feed`` each chunk, send on what it returns, then ``finish``."""

    def __init__(self, *, strip_usage: bool, progress_batch: int) -> None:
        self.strip_usage = strip_usage
        self.schedule = ProgressSchedule(progress_batch)
        self.usage: Usage | None = None
        self.generated = 0
        self._pending = b""

    def feed(self, data: bytes) -> tuple[bytes, int | None]:
        """(bytes to send on now, a generated count to report or None)."""
        if self._pending:
            data = self._pending + data
        normalised = data.replace(b"\r\n", b"\n") if b"\r" in data else data
        end = normalised.rfind(b"\n\n")
        if end < 0:
            self._pending = data
            return b"", None
        events, self._pending = normalised[: end + 2], normalised[end + 2 :]
        return self._events(events)

    def finish(self) -> bytes:
        """What is left (an unterminated last event), as it came."""
        rest, self._pending = self._pending, b""
        return rest

    def _events(self, events: bytes) -> tuple[bytes, int | None]:
        if self.strip_usage:
            events = strip_null_usage(events)
        events, usage = take_usage(events, self.strip_usage)
        if usage is not None:
            self.usage = usage
        self.generated += count_generated(events)
        bears = self.schedule.first_seen or events_bear_content(events)
        return events, self.schedule.report(self.generated, bears)


class UnaryObserver:
    """A non-streamed JSON answer: collected to read its usage at the end."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._size = 0
        self.usage: Usage | None = None

    def feed(self, data: bytes) -> bytes:
        if self._size <= MAX_UNARY_BYTES:
            self._parts.append(data)
            self._size += len(data)
        return data

    def finish(self) -> None:
        if not self._parts or self._size > MAX_UNARY_BYTES:
            return
        try:
            payload = json.loads(b"".join(self._parts))
        except ValueError:
            return
        if isinstance(payload, dict):
            self.usage = parse_usage(payload)
