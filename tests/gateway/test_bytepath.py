"""The protocol-level byte path: HTTP/1.1 de-chunking and the SSE relay, split anywhere."""

from __future__ import annotations

import asyncio
import json

from kvgate.gateway.bytepath import SseRelay
from kvgate.gateway.upstream import Exchange, UpstreamPool


class Sink:
    """A client transport that records what it is given."""

    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0


def event(content: str | None, *, usage: dict | None = None, null_usage: bool = True) -> bytes:
    body: dict = {
        "id": "x",
        "choices": [] if content is None else [{"delta": {"content": content}}],
    }
    if usage is not None:
        body["usage"] = usage
    elif null_usage:
        body["usage"] = None
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def chunked(parts: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def dechunk(data: bytes) -> bytes:
    out, pos = b"", 0
    while True:
        eol = data.index(b"\r\n", pos)
        size = int(data[pos:eol], 16)
        if size == 0:
            return out
        out += data[eol + 2 : eol + 2 + size]
        pos = eol + 2 + size + 2


async def relay_through(wire: bytes, step: int, *, strip: bool) -> tuple[SseRelay, bytes, bool]:
    exchange = Exchange(UpstreamPool(connect_timeout_s=1), ("h", 1))
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    stream = head + wire
    relay = SseRelay(exchange, strip_usage=strip, on_progress=None, progress_batch=16)
    exchange.data_received(stream[:step])
    exchange.attach(relay.feed)
    client = Sink()
    relay.go_live(client, chunked=True)  # type: ignore[arg-type]
    for i in range(step, len(stream), step):
        exchange.data_received(stream[i : i + step])
    tail = relay.take_tail()  # what the proxy writes with the end of the response
    framed = b"%x\r\n%b\r\n" % (len(tail), tail) if tail else b""
    return relay, dechunk(client.data + framed + b"0\r\n\r\n"), exchange.complete


async def test_relay_is_the_same_however_the_bytes_are_split() -> None:
    usage = {
        "prompt_tokens": 9,
        "completion_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    events = [event("Hel"), event(""), event("lo"), event(None, usage=usage), b"data: [DONE]\n\n"]
    wire = chunked([events[0] + events[1][:7], events[1][7:], events[2], events[3] + events[4]])
    expected = (event("Hel", null_usage=False) + event("", null_usage=False)
                + event("lo", null_usage=False) + b"data: [DONE]\n\n")  # fmt: skip
    for step in (1, 3, 17, 64, len(wire) + 200):
        relay, out, complete = await relay_through(wire, step, strip=True)
        assert out == expected, step
        assert complete and relay.done
        assert relay.generated == 2  # non-empty content chunks
        assert relay.usage is not None
        assert (relay.usage.prompt_tokens, relay.usage.cached_tokens) == (9, 4)


async def test_relay_holds_the_events_from_done_on_for_the_end_of_the_response() -> None:
    exchange = Exchange(UpstreamPool(connect_timeout_s=1), ("h", 1))
    exchange.data_received(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    relay = SseRelay(exchange, strip_usage=False, on_progress=None, progress_batch=16)
    exchange.attach(relay.feed)
    client = Sink()
    relay.go_live(client, chunked=True)  # type: ignore[arg-type]
    first = event("a", null_usage=False)
    exchange.data_received(chunked([first])[:-5])  # one event, the stream goes on
    assert dechunk(client.data + b"0\r\n\r\n") == first
    last = b"data: [DONE]\n\n"
    exchange.data_received(b"%x\r\n%b\r\n" % (len(last), last))
    assert dechunk(client.data + b"0\r\n\r\n") == first  # held, not written
    assert relay.done and relay.take_tail() == last
    assert relay.take_tail() == b""  # handed over once


async def test_relay_keeps_usage_the_client_asked_for() -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 1}
    events = event("a") + event(None, usage=usage) + b"data: [DONE]\n\n"
    relay, out, _ = await relay_through(chunked([events]), 5, strip=False)
    assert out == events
    assert relay.usage is not None and relay.usage.completion_tokens == 1


async def test_broken_connection_fails_the_exchange() -> None:
    exchange = Exchange(UpstreamPool(connect_timeout_s=1), ("h", 1))
    exchange.data_received(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab")
    exchange.connection_lost(None)
    try:
        await asyncio.wait_for(exchange.finished(), 1)
    except Exception as exc:
        assert type(exc).__name__ == "UpstreamError"
    else:
        raise AssertionError("a cut stream must not finish cleanly")
