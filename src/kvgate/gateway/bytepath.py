"""The streamed byte path: upstream SSE bytes to the client transport without decoding events.

``SseRelay.feed`` runs inside the upstream connection's ``data_received``. It cuts the
bytes at the last complete event, and then works on the whole run of complete events at
once with C-level byte scans: ``[DONE]`` by substring (a Responses API stream ends at its
terminal event instead: ``response.completed``, ``.incomplete`` or ``.failed``),
generated tokens by counting non-empty ``"content":"``/``"text":"`` fields, or a
Responses stream's ``response.output_text.delta`` events (engines stream about one
token per chunk; exact counts arrive with usage), usage only where ``"usage":{`` occurs (that one event
is JSON-parsed), and the injected ``"usage":null`` fields removed by ``bytes.replace``.
The first content-bearing chunk (``pipeline.first_token``) is reported at once, whatever
the batch: admission times the first token from it. Everything that arrived together
leaves in one write. Until the client's response is
ready (``go_live``) output is held, so a failure before the first byte can be retried.
An ``on_events`` observer (the Responses API's response-id watch) is handed each run of
complete events as it passes, before it is written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from kvgate.gateway.sse import parse_event
from kvgate.gateway.upstream import Exchange
from kvgate.gateway.usage import Usage, is_usage_only_chunk, parse_usage
from kvgate.pipeline.first_token import ProgressSchedule, events_bear_content

_HIGH_WATER = 256 * 1024  # client write buffer above this: stop reading upstream
_LOW_WATER = 64 * 1024
_RESUME_POLL_S = 0.005
_USAGE_MARKS = (b'"usage":{', b'"usage": {')
# the events that end a Responses API stream (it sends no [DONE])
_RESPONSE_ENDS = (b"event: response.completed", b"event: response.incomplete",
                  b"event: response.failed")  # fmt: skip
_RESPONSE_DELTA = b'"type":"response.output_text.delta"'
# first events → (the client's transport, its response) once written, or None (not opened)
Opener = Callable[[bytes], "tuple[asyncio.Transport, Any] | None"]


def strip_null_usage(raw: bytes) -> bytes:
    return raw.replace(b',"usage":null', b"").replace(b', "usage": null', b"")


def take_usage(events: bytes, strip_usage_chunks: bool) -> tuple[bytes, Usage | None]:
    """The last usage a run of complete events carries (only events with a ``"usage":{``
    are parsed) and the events to send on: without usage-only chunks when
    ``strip_usage_chunks`` (the client did not ask for usage; kvgate did)."""
    if not any(mark in events for mark in _USAGE_MARKS):
        return events, None
    found: Usage | None = None
    kept = []
    for raw in events.split(b"\n\n"):
        if raw and any(mark in raw for mark in _USAGE_MARKS):
            data = parse_event(raw).json()
            if data is not None:
                usage = parse_usage(data)
                if usage is not None:
                    found = usage
                if strip_usage_chunks and is_usage_only_chunk(data):
                    continue
        kept.append(raw)
    return b"\n\n".join(kept), found


def count_generated(events: bytes) -> int:
    """Streamed chunks that carry text (≈ tokens: engines stream about one per chunk)."""
    n = events.count(b'"content":"')
    if n:  # a chat stream: no completion "text" fields to look for
        return n - events.count(b'"content":""')
    n = events.count(_RESPONSE_DELTA)
    if n:  # a Responses stream: its done events repeat the whole text
        return n
    n = events.count(b'"text":"')
    return n - events.count(b'"text":""') if n else 0


def ends_response_stream(events: bytes) -> bool:
    """Whether a Responses API stream's terminal event is among ``events``."""
    return b"event: response." in events and any(end in events for end in _RESPONSE_ENDS)


class SseRelay:
    def __init__(
        self,
        exchange: Exchange,
        *,
        strip_usage: bool,
        on_progress: Callable[[int], None] | None,
        progress_batch: int,
        opener: Opener | None = None,
        on_events: Callable[[bytes], None] | None = None,
    ) -> None:
        self.exchange = exchange
        self.on_events = on_events
        self.strip_usage = strip_usage
        self.on_progress = on_progress
        self.schedule = ProgressSchedule(progress_batch)
        self.usage: Usage | None = None
        self.generated = 0
        self.done = False  # [DONE] seen
        self.client_gone = False
        self.reads = 0  # upstream reads seen (the idle timeout checks it per gap)
        # the exchange's loop: asyncio.get_running_loop() costs a getpid syscall per call
        self.ready: asyncio.Future[None] = exchange.done_future.get_loop().create_future()
        self._pending = b""  # an incomplete event
        self._held: list[bytes] = []  # output before go_live
        # a live stream's events from its [DONE] on: the proxy writes them with the end
        # of the response (the chunked terminator), one write instead of two
        self._tail: list[bytes] = []
        self._transport: asyncio.Transport | None = None
        self._chunked = True
        self._paused = False
        # opens the client's response with the first events, inside data_received (the
        # lean front writes its head synchronously): no wake-up of the proxy in between
        self._opener = opener
        self.opened: Any = None  # what the opener opened (the client's response)

    # -- called from data_received ------------------------------------------------------
    def feed(self, data: bytes) -> None:
        self.reads += 1
        if self._pending:
            data = self._pending + data
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        if data.endswith(b"\n\n"):  # the usual read: whole events only
            events = data
            self._pending = b""
        else:
            end = data.rfind(b"\n\n")
            if end < 0:
                self._pending = data
                return
            events, self._pending = data[: end + 2], data[end + 2 :]
        if not self.done and (
            (b"[DONE]" in events and (b"data: [DONE]" in events or b"data:[DONE]" in events))
            or ends_response_stream(events)
        ):
            self.done = True
        if self.on_events is not None:
            self.on_events(events)
        if self.strip_usage:
            # the usage option kvgate added puts "usage":null in every chunk: drop it first,
            # so only a chunk with real usage takes the slow path
            events = strip_null_usage(events)
        if b'"usage"' in events:
            events = self._usage(events)
        generated = self.generated = self.generated + count_generated(events)
        if events:
            transport = self._transport
            if self.done and transport is not None and not transport.is_closing():
                self._tail.append(events)
            else:
                self._out(events)
        if self.on_progress is not None:
            schedule = self.schedule
            bears = schedule.first_seen or events_bear_content(events)
            count = schedule.report(generated, bears)
            if count is not None:
                self.on_progress(count)

    def _usage(self, events: bytes) -> bytes:
        events, usage = take_usage(events, self.strip_usage)
        if usage is not None:
            self.usage = usage
        return events

    def _out(self, data: bytes) -> None:
        transport = self._transport
        if transport is None and self._opener is not None:
            opener, self._opener = self._opener, None
            opened = opener(data)  # the head and these events, in one write
            if opened is not None:
                self._transport, self.opened = opened
                self._chunked = True
                return
        if transport is None:
            self._held.append(data)
            if not self.ready.done():
                self.ready.set_result(None)
            return
        if transport.is_closing():
            self.client_gone = True
            self.exchange.abort()
            return
        transport.write(b"%x\r\n%b\r\n" % (len(data), data) if self._chunked else data)
        if not self._paused and transport.get_write_buffer_size() > _HIGH_WATER:
            self._paused = True
            self.exchange.pause()
            asyncio.get_running_loop().call_later(_RESUME_POLL_S, self._maybe_resume)

    def _maybe_resume(self) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            self.client_gone = True
            self.exchange.abort()
            return
        if transport.get_write_buffer_size() <= _LOW_WATER:
            self._paused = False
            self.exchange.resume()
        else:
            asyncio.get_running_loop().call_later(_RESUME_POLL_S, self._maybe_resume)

    # -- called by the proxy coroutine ----------------------------------------------------
    def wake_on_end(self) -> None:
        """Make ``ready`` also resolve when the upstream answer ends (or fails)."""

        def wake() -> None:
            if not self.ready.done():
                self.ready.set_result(None)

        self.exchange.on_end(wake)

    def take_tail(self) -> bytes:
        """The live stream's last events, held for the write that ends the response."""
        tail, self._tail = self._tail, []
        return b"".join(tail)

    def take_held(self) -> bytes:
        held, self._held = self._held, []
        return b"".join(held)

    def go_live(self, transport: asyncio.Transport, *, chunked: bool) -> None:
        """From now on, events go straight to ``transport`` (framed when ``chunked``)."""
        self._chunked = chunked
        self._transport = transport
        held = self.take_held()
        if held:
            self._out(held)
