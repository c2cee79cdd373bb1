"""Server-sent events: split an upstream byte stream into events and read their JSON data."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class SseEvent:
    raw: bytes  # the event's bytes without the blank-line terminator
    data: bytes | None  # joined data: lines, or None for comment/keep-alive events

    @property
    def is_done(self) -> bool:
        return self.data == b"[DONE]"

    def json(self) -> dict[str, Any] | None:
        if self.data is None or self.is_done:
            return None
        try:
            value = json.loads(self.data)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None


class SseSplitter:
    """Feed raw chunks; get whole events back as soon as their terminator has arrived."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> Iterator[SseEvent]:
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n")
        self._buffer += chunk
        while True:
            end = self._buffer.find(b"\n\n")
            if end < 0:
                return
            raw, self._buffer = self._buffer[:end], self._buffer[end + 2 :]
            if raw:
                yield parse_event(raw)

    @property
    def pending(self) -> bytes:
        return self._buffer


def parse_event(raw: bytes) -> SseEvent:
    data_lines = []
    for line in raw.split(b"\n"):
        if line.startswith(b"data:"):
            value = line[5:]
            data_lines.append(value[1:] if value.startswith(b" ") else value)
    return SseEvent(raw=raw, data=b"\n".join(data_lines) if data_lines else None)
