"""The lean HTTP front (kvgate.gateway.front): plain generate requests are its own, every
other request (and the rest of its connection) is aiohttp's, answered as without it.

Raw HTTP/1.1 over one socket, so keep-alive, pipelining and split writes are what is
tested, not a client library's behaviour.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import re
from typing import Any

import pytest
from aiohttp import web

from tests.fixtures.gateway import running_gateway
from tests.gateway._engines import engines
from tests.gateway.test_bytepath import dechunk

CHAT = "/v1/chat/completions"
LIMIT = 8192


def chat(stream: bool, max_tokens: int = 4) -> bytes:
    body = {
        "model": "sim",
        "stream": stream,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": "hello front"}],
    }
    return json.dumps(body).encode()


def post(path: str, body: bytes, *, extra: str = "", length: bool = True) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n{extra}"
    if length:
        head += f"Content-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self) -> Any:
        return json.loads(self.body)


async def read_answer(reader: asyncio.StreamReader) -> Answer:
    """One response: Content-Length or chunked body (interim 1xx heads are skipped)."""
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        if status >= 200:
            break
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            body += (await reader.readexactly(size + 2))[:-2]
            if size == 0:
                break
    else:
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    return Answer(status, headers, body)


def counts(gw: Any) -> tuple[float, float]:
    registry = gw.gateway.registry
    served = registry.get_sample_value("kvgate_front_lean_requests_total") or 0.0
    handed = registry.get_sample_value("kvgate_front_handovers_total") or 0.0
    return served, handed


@pytest.fixture(scope="module")
def engine_url():
    with engines(1, separate=False) as started:
        yield started[0].url


def config(url: str, **server: Any) -> dict[str, Any]:
    return {
        "nodes": [{"id": "e0", "url": url}],
        "server": {"max_body_bytes": LIMIT, **server},
    }


async def connect(gw: Any) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    port = int(gw.url.rsplit(":", 1)[1])
    return await asyncio.open_connection("127.0.0.1", port)


async def test_pipelined_streams_and_split_writes_on_one_connection(engine_url: str) -> None:
    async with running_gateway(config(engine_url)) as gw:
        reader, writer = await connect(gw)
        # two streamed requests in one write, then a unary one sent in pieces
        writer.write(post(CHAT, chat(True)) + post(CHAT, chat(True, 6)))
        unary = post(CHAT, chat(False))
        first = await read_answer(reader)
        for piece in (unary[:20], unary[20:90], unary[90:-5], unary[-5:]):
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.01)
        second, third = await read_answer(reader), await read_answer(reader)
        for answer, tokens in ((first, 4), (second, 6)):
            assert answer.status == 200
            assert answer.headers["content-type"] == "text/event-stream"
            assert answer.headers["x-kvgate-node"] == "e0"
            events = [e for e in answer.body.split(b"\n\n") if e]
            assert events[-1] == b"data: [DONE]"
            assert len(events) == tokens + 1  # the usage chunk kvgate asked for is gone
        assert third.status == 200
        assert third.json()["usage"]["completion_tokens"] == 4
        assert counts(gw) == (3.0, 0.0)
        writer.close()


async def test_other_requests_hand_the_connection_to_aiohttp(engine_url: str) -> None:
    async with running_gateway(config(engine_url)) as gw:
        reader, writer = await connect(gw)
        writer.write(post("/v1/completions", b'{"model": "sim"}'))
        answer = await read_answer(reader)
        assert answer.status == 400
        assert answer.json()["error"]["param"] == "prompt"
        assert counts(gw) == (1.0, 0.0)
        # a GET on the same connection: aiohttp's from here on, every later request too
        writer.write(b"GET /health HTTP/1.1\r\nHost: gw\r\n\r\n" + post(CHAT, chat(False)))
        health, after = await read_answer(reader), await read_answer(reader)
        assert health.status == 200 and health.json()["status"] == "ok"
        assert after.status == 200 and after.json()["usage"]["completion_tokens"] == 4
        assert counts(gw) == (1.0, 1.0)
        writer.close()


@pytest.mark.parametrize(
    ("name", "request_bytes", "status", "code"),
    [
        (
            "chunked body",
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"%x\r\n%b\r\n0\r\n\r\n" % (len(chat(False)), chat(False)),
            200,
            None,
        ),
        ("gzip body", post(CHAT, gzip.compress(chat(False)), extra="Content-Encoding: gzip\r\n"),
         200, None),
        ("expect 100-continue", post(CHAT, chat(False), extra="Expect: 100-continue\r\n"),
         200, None),
        ("odd expect", post(CHAT, chat(False), extra="Expect: later\r\n"), 417,
         "expectation_failed"),
        ("over the limit", post(CHAT, b"{" + b" " * LIMIT + b"}"), 413, "body_too_large"),
        ("query string", post(CHAT + "?x=1", chat(False)), 200, None),
        ("non-ASCII header", post(CHAT, chat(False), extra="X-Note: caf\u00e9\r\n"), 200, None),
        ("no length", post(CHAT, b"", length=False), 400, None),
        ("no host", post(CHAT, chat(False)).replace(b"Host: gw\r\n", b""), 400, None),
        ("two lengths", post(CHAT, chat(False), extra="Content-Length: 3\r\n"), 400, None),
    ],
)  # fmt: skip
async def test_requests_it_does_not_take_are_answered_as_before(
    engine_url: str, name: str, request_bytes: bytes, status: int, code: str | None
) -> None:
    async with running_gateway(config(engine_url)) as gw:
        reader, writer = await connect(gw)
        writer.write(request_bytes)
        answer = await read_answer(reader)
        assert answer.status == status, name
        if code is not None:
            assert answer.json()["error"]["code"] == code
        assert counts(gw) == (0.0, 1.0)
        writer.close()


async def test_lean_front_off_serves_everything_with_aiohttp(engine_url: str) -> None:
    async with running_gateway(config(engine_url, lean_front=False)) as gw:
        reader, writer = await connect(gw)
        writer.write(post(CHAT, chat(True)))
        answer = await read_answer(reader)
        assert answer.status == 200
        assert answer.body.endswith(b"data: [DONE]\n\n")
        assert counts(gw) == (0.0, 0.0)
        writer.close()


async def test_client_that_leaves_cancels_its_request(engine_url: str) -> None:
    async with running_gateway(config(engine_url)) as gw:
        reader, writer = await connect(gw)
        writer.write(post(CHAT, chat(True, 4000)))
        await reader.readuntil(b"data: ")  # streaming
        writer.close()
        metrics = gw.gateway.metrics
        for _ in range(200):
            if metrics.inflight._value.get() == 0:
                break
            await asyncio.sleep(0.02)
        registry = gw.gateway.registry
        assert metrics.inflight._value.get() == 0
        assert registry.get_sample_value("kvgate_client_disconnects_total") == 1.0
        assert (
            registry.get_sample_value("kvgate_requests_total", {"endpoint": CHAT, "status": "499"})
            == 1.0
        )


async def raw_head_and_body(gw: Any, request_bytes: bytes) -> tuple[bytes, bytes]:
    reader, writer = await connect(gw)
    writer.write(request_bytes)
    head = await reader.readuntil(b"\r\n\r\n")
    body = await reader.readuntil(b"\r\n0\r\n\r\n")
    writer.close()
    return re.sub(rb"Date: [^\r]*", b"Date: -", head), body


async def test_stream_bytes_are_aiohttps(engine_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The head the front writes for a stream is byte for byte what aiohttp's server
    writes (the Date aside); the events are the same."""
    request_bytes = post(CHAT, chat(True, 3), extra="X-Request-Id: same-id\r\n")
    answers = []
    for lean in (True, False):
        with monkeypatch.context() as patch:
            if lean:  # the front must write the stream's head itself, not aiohttp's writer
                patch.setattr(web.StreamResponse, "prepare", _not_called)
            async with running_gateway(config(engine_url, lean_front=lean)) as gw:
                answers.append(await raw_head_and_body(gw, request_bytes))
                assert counts(gw)[0] == (1.0 if lean else 0.0)
    (lean_head, lean_body), (aio_head, aio_body) = answers
    assert lean_head == aio_head
    assert b"Transfer-Encoding: chunked" in lean_head
    # the events alike (chunk sizes follow how the engine's writes were read: not compared)
    strip = re.compile(rb'"(id|created)":[^,]*,')  # the engine's per-answer fields
    assert strip.sub(b"", dechunk(lean_body)) == strip.sub(b"", dechunk(aio_body))


async def _not_called(*_: Any) -> None:
    raise AssertionError("aiohttp's StreamResponse.prepare was used")


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "aiohttp"])
async def test_client_that_leaves_during_the_body_is_counted_alike(
    engine_url: str, lean: bool
) -> None:
    """aiohttp runs the handler once the head is in: a client that leaves mid-body is a
    cancelled request (499), and the lean front answers for it the same way."""
    async with running_gateway(config(engine_url, lean_front=lean)) as gw:
        _, writer = await connect(gw)
        whole = post(CHAT, chat(False))
        writer.write(whole[: len(whole) - 10])
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.close()
        registry = gw.gateway.registry
        labels = {"endpoint": CHAT, "status": "499"}
        for _ in range(100):
            if registry.get_sample_value("kvgate_requests_total", labels):
                break
            await asyncio.sleep(0.02)
        assert registry.get_sample_value("kvgate_requests_total", labels) == 1.0
        assert gw.gateway.metrics.inflight._value.get() == 0
        assert counts(gw) == (0.0, 0.0)
