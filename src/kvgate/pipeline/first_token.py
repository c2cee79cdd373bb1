"""The first token of a stream: the first chunk that bears content.

One definition for every driver. The gateway's byte path and the worker's (whose owner
applies the report) call ``events_bear_content`` on the raw SSE events; the simulator
and engine-sim, which hold parsed chunks, call ``chunk_bears_content``. Both read the
same fields: a non-empty ``delta.content``, ``delta.reasoning_content`` (or
``delta.reasoning``), any ``delta.tool_calls`` / ``delta.function_call`` entry in a chat
stream, a non-empty ``text`` in a completions stream, or a Responses API delta event
(``response.output_text.delta`` and the other ``….delta`` events with a non-empty
``delta``). A role-only opening chunk, an empty delta, a usage-only chunk, the Responses
lifecycle events (``response.created`` …) and ``[DONE]`` bear none.

``ProgressSchedule`` decides which generated-token counts are reported: the first
content-bearing chunk at once (independent of batching: admission times its first token
from it), then every ``batch`` generated tokens.
"""

from __future__ import annotations

from typing import Any

import msgspec

# A cheap pre-check: an event without one of these byte strings cannot bear content.
_MARKS = (
    b'"content"',
    b'"text"',
    b'"reasoning',
    b'"tool_calls"',
    b'"function_call"',
    b'.delta"',  # a Responses API delta event's type
)
# Responses API stream events that carry generated output (text, reasoning, tool arguments)
_RESPONSE_DELTAS = frozenset(
    {
        "response.output_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.function_call_arguments.delta",
        "response.refusal.delta",
    }
)
_DELTA_TEXT_FIELDS = ("content", "reasoning_content", "reasoning")
_DELTA_CALL_FIELDS = ("tool_calls", "function_call")
_decode = msgspec.json.Decoder().decode


def chunk_bears_content(chunk: Any) -> bool:
    """Whether one parsed stream chunk (chat or completions) carries generated output."""
    if not isinstance(chunk, dict):
        return False
    choices = chunk.get("choices")
    if not isinstance(choices, list):
        delta = chunk.get("delta")
        return chunk.get("type") in _RESPONSE_DELTAS and isinstance(delta, str) and bool(delta)
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict):
            for name in _DELTA_TEXT_FIELDS:
                value = delta.get(name)
                if isinstance(value, str) and value:
                    return True
            for name in _DELTA_CALL_FIELDS:
                if delta.get(name):
                    return True
        text = choice.get("text")
        if isinstance(text, str) and text:
            return True
    return False


def events_bear_content(events: bytes) -> bool:
    """Whether any complete SSE event in ``events`` (LF-normalised) bears content."""
    if not any(mark in events for mark in _MARKS):
        return False
    for raw in events.split(b"\n\n"):
        if not any(mark in raw for mark in _MARKS):
            continue
        for line in raw.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if not payload or payload == b"[DONE]":
                continue
            try:
                chunk = _decode(payload)
            except msgspec.DecodeError:
                continue
            if chunk_bears_content(chunk):
                return True
    return False


class ProgressSchedule:
    """Which generated-token counts a stream reports, as chunks arrive."""

    __slots__ = ("batch", "first_seen", "reported")

    def __init__(self, batch: int) -> None:
        self.batch = max(1, batch)
        self.first_seen = False
        self.reported = 0

    def report(self, generated: int, bears_content: bool) -> int | None:
        """The count to report after a chunk (``generated`` so far), or None.

        The first content-bearing chunk reports at least 1 (a tool call or reasoning
        chunk is a token even when the text count has not moved)."""
        if not self.first_seen:
            if not bears_content:
                return None
            self.first_seen = True
            self.reported = max(1, generated)
            return self.reported
        if generated - self.reported >= self.batch:
            self.reported = generated
            return generated
        return None
