"""The first token is the first content-bearing chunk, the same for every driver.

The byte path (gateway and worker) reads raw SSE bytes split anywhere; the simulator's
and engine-sim's side reads parsed chunks. The same chunk sequences go through both and
must report the same counts at the same chunk.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from kvgate.gateway.bytepath import SseRelay
from kvgate.gateway.upstream import Exchange, UpstreamPool
from kvgate.pipeline.first_token import ProgressSchedule, chunk_bears_content, events_bear_content

ROLE = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
EMPTY = {"choices": [{"index": 0, "delta": {}}]}
USAGE = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}


def text(t: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": t}}]}


def reasoning(t: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"reasoning_content": t}}]}


def tool_call() -> dict[str, Any]:
    call = {"index": 0, "id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}
    return {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}


def completion(t: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "text": t, "finish_reason": None}]}


@pytest.mark.parametrize(
    ("chunk", "bears"),
    [
        (ROLE, False),
        (EMPTY, False),
        (USAGE, False),
        (text(""), False),
        (completion(""), False),
        (text("a"), True),
        (reasoning("think"), True),
        ({"choices": [{"delta": {"reasoning": "r"}}]}, True),
        (tool_call(), True),
        ({"choices": [{"delta": {"function_call": {"name": "f"}}}]}, True),
        (completion("x"), True),
        ({"choices": [{"delta": {"tool_calls": []}}]}, False),
        ({"choices": "nonsense"}, False),
        ([1, 2], False),
    ],
)
def test_which_chunks_bear_content(chunk: Any, bears: bool) -> None:
    assert chunk_bears_content(chunk) is bears
    wire = b"data: " + json.dumps(chunk).encode() + b"\n\n"
    assert events_bear_content(wire) is bears


def test_done_and_garbage_bear_nothing() -> None:
    assert not events_bear_content(b"data: [DONE]\n\n")
    assert not events_bear_content(b'data: {"content": "x"\n\n')  # cut JSON
    assert not events_bear_content(b": keep-alive\n\n")


SEQUENCES: dict[str, list[dict[str, Any]]] = {
    "chat": [ROLE] + [text(c) for c in "hello world, this is a long answer"] + [USAGE],
    "tool_call_first": [ROLE, tool_call()] + [text("x")] * 20,
    "reasoning_first": [ROLE, EMPTY] + [reasoning("r")] * 3 + [text("t")] * 18,
    "completion": [completion(c) for c in "abcdefghijklmnopqrstuvwxyz0123456789"],
    "empty_then_text": [text(""), text(""), text("a"), text("b")],
    "nothing": [ROLE, EMPTY, USAGE],
}


def parsed_reports(chunks: list[dict[str, Any]], batch: int) -> list[tuple[int, int]]:
    """(chunk index, count reported) as the parsed-chunk side (simulator, engine-sim) sees."""
    schedule = ProgressSchedule(batch)
    generated, out = 0, []
    for i, chunk in enumerate(chunks):
        choice = (chunk.get("choices") or [{}])[0]
        delta = choice.get("delta") or {}
        piece = delta.get("content") if "delta" in choice else choice.get("text")
        generated += 1 if isinstance(piece, str) and piece else 0
        count = schedule.report(generated, chunk_bears_content(chunk))
        if count is not None:
            out.append((i, count))
    return out


def relay_reports(
    chunks: list[dict[str, Any]], batch: int, rng: random.Random
) -> list[tuple[int, int]]:
    """(chunk index, count reported) as the byte path sees, the bytes split at random."""
    events = [b"data: " + json.dumps(c, separators=(",", ":")).encode() + b"\n\n" for c in chunks]
    events.append(b"data: [DONE]\n\n")
    exchange = Exchange(UpstreamPool(connect_timeout_s=1), ("h", 1))
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n"
    body = b"".join(events)
    exchange.data_received(head % len(body))
    reports: list[tuple[int, int]] = []
    position = [0]  # the index of the last chunk whose bytes have arrived whole

    relay = SseRelay(
        exchange,
        strip_usage=False,
        on_progress=lambda n: reports.append((position[0], n)),
        progress_batch=batch,
    )
    exchange.attach(relay.feed)
    ends = []
    total = 0
    for e in events:
        total += len(e)
        ends.append(total)
    pos = 0
    while pos < len(body):
        step = rng.choice((1, 7, 50, 200, 10_000))
        upto = min(len(body), pos + step)
        position[0] = max([i for i, end in enumerate(ends) if end <= upto], default=-1)
        exchange.data_received(body[pos:upto])
        pos = upto
    return reports


@pytest.mark.parametrize("name", sorted(SEQUENCES))
@pytest.mark.parametrize("batch", [1, 4, 16])
async def test_byte_path_and_parsed_chunks_report_alike(name: str, batch: int) -> None:
    chunks = SEQUENCES[name]
    expected = parsed_reports(chunks, batch)
    rng = random.Random(f"{name}-{batch}")
    for _ in range(20):
        got = relay_reports(chunks, batch, rng)
        # a read carrying several chunks reports once, at its last whole chunk, with the
        # latest count: compare the first report exactly, then the counts' progression
        if expected:
            assert got, name
            first_index = expected[0][0]
            assert got[0][0] >= first_index
            assert got[0][1] >= 1
        else:
            assert got == []
        # never a report before the first content-bearing chunk has arrived
        assert all(i >= (expected[0][0] if expected else 0) for i, _ in got)


@pytest.mark.parametrize("name", sorted(SEQUENCES))
async def test_the_first_report_comes_with_its_chunk_when_chunks_arrive_one_by_one(
    name: str,
) -> None:
    chunks = SEQUENCES[name]
    for batch in (1, 16, 64):
        expected = parsed_reports(chunks, batch)
        events = [
            b"data: " + json.dumps(c, separators=(",", ":")).encode() + b"\n\n" for c in chunks
        ]
        exchange = Exchange(UpstreamPool(connect_timeout_s=1), ("h", 1))
        exchange.data_received(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        got: list[tuple[int, int]] = []
        index = [0]
        relay = SseRelay(
            exchange,
            strip_usage=False,
            on_progress=lambda n, got=got, index=index: got.append((index[0], n)),
            progress_batch=batch,
        )
        exchange.attach(relay.feed)
        for i, e in enumerate(events):
            index[0] = i
            exchange.data_received(b"%x\r\n%b\r\n" % (len(e), e))
        assert got == expected, (name, batch)


def test_the_first_token_does_not_wait_for_a_batch() -> None:
    schedule = ProgressSchedule(16)
    assert schedule.report(0, False) is None
    assert schedule.report(1, True) == 1  # at once, although 1 < 16
    assert schedule.report(15, True) is None
    assert schedule.report(17, True) == 17
    tool = ProgressSchedule(16)
    assert tool.report(0, True) == 1  # a tool call chunk counts no text, but is a token
