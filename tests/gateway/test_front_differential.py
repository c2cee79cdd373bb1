"""The lean front (kvgate.gateway.front) against aiohttp's own HTTP/1.1 parser on hostile
input: request smuggling, odd framing, control bytes, over-long heads, pipelining.

The front parses only the plain form of the hot requests itself and hands everything else
(and the rest of its connection) to aiohttp's server. So the property is near exact: for
the same bytes on one connection, a server behind the front and aiohttp's plain server
answer with the same bytes (the Date aside, and a 400's text) — the same accept/refuse
decision, and for every accepted request the same method, path, headers and body, as an
echo handler reports them (headers in full, the body as its length and sha256).

Two things are allowed, both checked, neither a request the front reads otherwise:

* aiohttp's server refuses every request of a segment it read when one of them is bad
  (its parser raises for the whole segment). Where the front answers requests before a
  bad one that aiohttp, fed them in one segment, refused with it, the front must answer
  as aiohttp fed the same bytes cut where the front's requests end.
* refusing where aiohttp accepts: refusing is handing the connection to aiohttp, which
  then answers as without the front; ``STRICTER`` lists the shapes the front does not
  take though aiohttp accepts them, each the safer choice (``TAKEN``: what it takes).

Both of aiohttp's parsers are the reference: the C one (``aiohttp._http_parser``, what
the server uses) where it is built, and the pure-Python ``HttpRequestParserPy``; the
front's fallback and the plain server use the same one. The front runs as it really
runs: a ``FrontSite`` on a loopback port over an ``AppRunner`` (as ``serve_app`` starts
it), raw bytes through a socket; and once more fed byte by byte, where it must take the
same requests. A case's bytes go alone, or followed by a sentinel ``GET`` so the end of
the answers is known without waiting (else: the server closing, or a silence). The real
gateway, with the front on and off, must answer the hand-picked cases with the same
statuses.

Besides the hand-picked cases, a seeded mutator derives a few hundred cases from a corpus
of valid requests (byte edits and inserted framing headers, line-ending and case flips,
repeated and folded headers, shifted lengths, request-line edits).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import random
import re
import types
from collections.abc import AsyncIterator, Iterator, Sequence

import pytest
from aiohttp import web, web_protocol
from aiohttp.http_parser import HttpRequestParserPy

from kvgate.gateway.front import FrontRequest, FrontSite
from kvgate.gateway.gateway import GATEWAY
from tests.fixtures.gateway import running_gateway
from tests.gateway._engines import engines

try:
    from aiohttp.http_parser import HttpRequestParserC  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - aiohttp built without its extensions
    HttpRequestParserC = None

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
LIMIT = 4096  # max body bytes: the front's limit and the app's client_max_size
SENTINEL = b"GET /__end__ HTTP/1.1\r\nHost: end\r\n\r\n"
MARK = b"<<end-of-case>>"
VIA = "X-Parsed-By"
# a case whose last request stays unfinished: its answers end after IDLE_S of silence,
# counted in steps the event loop kept to time (all the servers share this loop: a busy
# loop is not a silent server)
IDLE_S = 0.4
STEP_S = 0.05
SEED = 20240524
MUTATED = 320

# --------------------------------------------------------------------------------------
# servers


class _Count:
    def __init__(self) -> None:
        self.value = 0

    def inc(self) -> None:
        self.value += 1


async def _echo(request: web.Request) -> web.Response:
    """What the handler was given: method, path, every header (names in lowercase: the C
    parser spells the names it knows its own way), the body's length and sha256 (only
    what the front's request object offers too)."""
    body = await request.read()
    response = web.json_response(
        {
            "method": request.method,
            "path": request.path,
            "headers": [[name.lower(), value] for name, value in request.headers.items()],
            "length": len(body),
            "sha256": hashlib.sha256(body).hexdigest(),
        }
    )
    if isinstance(request, FrontRequest):  # which of the two parsed it (not compared)
        response.headers[VIA] = "front"
    return response


async def _end(request: web.Request) -> web.Response:
    return web.Response(body=MARK)


def _app() -> tuple[web.Application, _Count, _Count]:
    app = web.Application(client_max_size=LIMIT)
    app.router.add_post(CHAT, _echo)
    app.router.add_post(COMPLETIONS, _echo)
    app.router.add_route("*", "/other", _echo)
    app.router.add_get("/__end__", _end)
    served, handed = _Count(), _Count()
    # the front reads only its two counters from the gateway
    app[GATEWAY] = types.SimpleNamespace(  # type: ignore[assignment]
        metrics=types.SimpleNamespace(front_requests=served, front_handovers=handed)
    )
    return app, served, handed


class Server:
    def __init__(self, port: int, served: _Count, handed: _Count) -> None:
        self.port, self.served, self.handed = port, served, handed


class _ByteFed(asyncio.Protocol):
    """A server protocol handed what arrives one byte at a time (the finest segmentation
    TCP may deliver). Once the protocol hands the transport to another (the front to
    aiohttp's), the rest of what arrived is that one's, as asyncio would deliver it."""

    def __init__(self, inner: asyncio.Protocol) -> None:
        self.inner = inner
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        for at in range(len(data)):
            if self.transport is not None and self.transport.get_protocol() is not self:
                protocol = self.transport.get_protocol()
                assert isinstance(protocol, asyncio.Protocol)
                protocol.data_received(data[at:])
                return
            self.inner.data_received(data[at : at + 1])

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class _ByteFedFrontSite(FrontSite):
    """The front, fed byte by byte (until it hands the connection over: the transport's
    protocol is then aiohttp's own)."""

    async def start(self) -> None:
        self._runner._reg_site(self)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _ByteFed(self.front()), "127.0.0.1", 0)


@contextlib.asynccontextmanager
async def serving(mode: str) -> AsyncIterator[Server]:
    """A server for the echo app: ``front`` (the lean front, as ``serve_app`` starts it),
    ``front-bytewise`` (the same, fed byte by byte) or ``aiohttp`` (aiohttp's plain
    server)."""
    app, served, handed = _app()
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1)
    await runner.setup()
    site: web.BaseSite
    if mode == "front":
        site = FrontSite(runner, max_body=LIMIT, host="127.0.0.1", port=0)
    elif mode == "front-bytewise":
        site = _ByteFedFrontSite(runner, max_body=LIMIT)
    else:
        site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = site._server
    assert isinstance(server, asyncio.Server)
    port = server.sockets[0].getsockname()[1]
    try:
        yield Server(port, served, handed)
    finally:
        await runner.cleanup()


_DATE = re.compile(rb"\r\nDate: [^\r\n]*")
_VIA = b"\r\n%b: front" % VIA.encode()


def taken(answer: bytes) -> int:
    """How many of the answers are to requests the front parsed itself."""
    return answer.count(_VIA)


def _answered(stream: bytes) -> int:
    """How many final answers (with their bodies) a stream holds in full."""
    count = 0
    while (end := stream.find(b"\r\n\r\n")) >= 0:
        if re.match(rb"HTTP/1\.1 1\d\d ", stream):
            stream = stream[end + 4 :]
            continue
        found = re.search(rb"\r\nContent-Length: (\d+)\r\n", stream[: end + 2])
        if found is None or len(stream) < end + 4 + int(found.group(1)):
            break
        stream = stream[end + 4 + int(found.group(1)) :]
        count += 1
    return count


async def exchange(
    port: int, data: bytes, sentinel: bool = True, cuts: Sequence[int] = ()
) -> bytes:
    """All the server answers to ``data`` (then the sentinel, unless told not) on one
    connection: up to the sentinel's answer, the server closing, or ``IDLE_S`` of
    silence. With ``cuts``, the bytes up to each cut go alone, each once the answer to
    the one before is in (so the server reads them apart)."""
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    got = b""
    ends = [*cuts, len(data)]
    pieces = [data[start:end] for start, end in zip([0, *cuts], ends, strict=True)]
    if sentinel:
        pieces[-1] += SENTINEL
    try:
        for number, piece in enumerate(pieces):
            writer.write(piece)
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            last = number == len(pieces) - 1
            quiet = 0.0
            while MARK not in got and quiet < IDLE_S and (last or _answered(got) <= number):
                started = loop.time()
                try:
                    chunk = await asyncio.wait_for(reader.read(65536), STEP_S)
                except TimeoutError:
                    if loop.time() - started < 2 * STEP_S:
                        quiet += STEP_S
                    continue
                except ConnectionError:
                    return _DATE.sub(b"\r\nDate: -", got)
                if not chunk:
                    return _DATE.sub(b"\r\nDate: -", got)
                got += chunk
                quiet = 0.0
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return _DATE.sub(b"\r\nDate: -", got)


async def answers(port: int, cases: list[bytes], sentinel: bool = True) -> list[bytes]:
    limit = asyncio.Semaphore(100)

    async def one(data: bytes) -> bytes:
        async with limit:
            return await exchange(port, data, sentinel)

    return list(await asyncio.gather(*(one(data) for data in cases)))


def front_cuts(data: bytes, lean: bytes) -> list[int]:
    """Where the requests the front answered itself end in ``data`` (each answer's head
    ends at the first blank line, its body is as long as the echo says)."""
    cuts, at = [], 0
    for answer in split(lean):
        if _VIA not in answer:
            break
        at = data.find(b"\r\n\r\n", at) + 4 + json.loads(answer.partition(b"\r\n\r\n")[2])["length"]
        cuts.append(at)
    return cuts


@contextlib.contextmanager
def parser(kind: str) -> Iterator[None]:
    """aiohttp's server (and the front's fallback, the same server) on one parser."""
    cls = HttpRequestParserC if kind == "c" else HttpRequestParserPy
    if cls is None:
        pytest.skip("aiohttp's C parser is not built")
    saved = web_protocol.HttpRequestParser
    web_protocol.HttpRequestParser = cls  # type: ignore[misc]
    try:
        yield
    finally:
        web_protocol.HttpRequestParser = saved  # type: ignore[misc]


# --------------------------------------------------------------------------------------
# cases

BODY = b'{"model": "sim", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}'


def req(
    headers: str | bytes = "",
    body: bytes = BODY,
    *,
    line: bytes = b"POST /v1/chat/completions HTTP/1.1",
    host: bytes = b"Host: gw\r\n",
    length: bool = True,
) -> bytes:
    """A chat request: ``headers`` (raw lines, each ending CRLF) after Host, then
    Content-Length (unless ``length`` is false), the blank line, ``body``."""
    extra = headers.encode() if isinstance(headers, str) else headers
    head = line + b"\r\n" + host + b"Content-Type: application/json\r\n" + extra
    if length:
        head += b"Content-Length: %d\r\n" % len(body)
    return head + b"\r\n" + body


def chunked(body: bytes = BODY, te: bytes = b"chunked", *, extra: bytes = b"") -> bytes:
    framed = b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body)
    return req(extra + b"Transfer-Encoding: " + te + b"\r\n", framed, length=False)


SMUGGLED = b"GET /other HTTP/1.1\r\nHost: gw\r\n\r\n"
N = len(BODY)
CHUNKS = b"%x\r\n%b\r\n0\r\n\r\n" % (N, BODY)

CASES: dict[str, bytes] = {
    # valid, for reference: the front's own, and aiohttp's
    "plain": req(),
    "plain completions": req(line=b"POST /v1/completions HTTP/1.1"),
    "empty body": req(body=b""),
    "zero length, no body": req("Content-Length: 0\r\n", b"", length=False),
    "leading zeros length": req(f"Content-Length: 000{N}\r\n", length=False),
    "length with spaces": req(f"Content-Length:   {N}  \r\n", length=False),
    "length with tab": req(f"Content-Length:\t{N}\t\r\n", length=False),
    "keep-alive": req("Connection: keep-alive\r\n"),
    "connection close": req("Connection: close\r\n"),
    "other path": req(line=b"POST /other HTTP/1.1"),
    "query": req(line=b"POST /v1/chat/completions?x=1 HTTP/1.1"),
    "HTTP/1.0": req(line=b"POST /v1/chat/completions HTTP/1.0"),
    "lowercase method": req(line=b"post /v1/chat/completions HTTP/1.1"),
    "absolute form": req(line=b"POST http://gw/v1/chat/completions HTTP/1.1"),
    "two spaces in line": req(line=b"POST  /v1/chat/completions HTTP/1.1"),
    "trailing space in line": req(line=b"POST /v1/chat/completions HTTP/1.1 "),
    "tab in line": req(line=b"POST\t/v1/chat/completions HTTP/1.1"),
    "version lowercase": req(line=b"POST /v1/chat/completions http/1.1"),
    "version 1.2": req(line=b"POST /v1/chat/completions HTTP/1.2"),
    "no host": req(host=b""),
    "empty host": req(host=b"Host:\r\n"),
    "two hosts": req(host=b"Host: gw\r\nHost: other\r\n"),
    # CL + TE together
    "CL then TE": req(b"Transfer-Encoding: chunked\r\n", CHUNKS, length=False).replace(
        b"Transfer-Encoding", b"Content-Length: 5\r\nTransfer-Encoding"
    ),
    "TE then CL": req(b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n", CHUNKS, length=False),
    "CL and TE smuggling GET": req(
        b"Transfer-Encoding: chunked\r\n", b"0\r\n\r\n" + SMUGGLED, length=True
    ),
    "CL and TE identity": req(b"Transfer-Encoding: identity\r\n"),
    # two Content-Lengths
    "two lengths equal": req(f"Content-Length: {N}\r\n"),
    "two lengths different": req("Content-Length: 3\r\n"),
    "two lengths, smaller first": req(
        f"Content-Length: 3\r\nContent-Length: {N}\r\n", length=False
    ),
    "length list": req(f"Content-Length: {N}, {N}\r\n", length=False),
    "length list different": req(f"Content-Length: 3, {N}\r\n", length=False),
    # Transfer-Encoding variants
    "chunked": chunked(),
    "chunked uppercase": chunked(te=b"CHUNKED"),
    "chunked mixed case": chunked(te=b"ChUnKeD"),
    "chunked, identity": chunked(te=b"chunked, identity"),
    "identity, chunked": chunked(te=b"identity, chunked"),
    "gzip, chunked": chunked(te=b"gzip, chunked"),
    "chunked, chunked": chunked(te=b"chunked, chunked"),
    "chunked leading space": chunked(te=b" chunked"),
    "chunked no space": req(b"Transfer-Encoding:chunked\r\n", CHUNKS, length=False),
    "chunked trailing garbage": chunked(te=b"chunked;q=1"),
    "chunked vertical tab": chunked(te=b"\x0bchunked"),
    "TE header name uppercase": req(b"TRANSFER-ENCODING: chunked\r\n", CHUNKS, length=False),
    "TE name with space": req(b"Transfer-Encoding : chunked\r\n", CHUNKS, length=False),
    "TE name underscore": req(b"Transfer_Encoding: chunked\r\n"),
    "two TE headers": req(
        b"Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n", CHUNKS, length=False
    ),
    "TE identity alone": req(b"Transfer-Encoding: identity\r\n", length=False),
    "TE chunked on HTTP/1.0": req(
        b"Transfer-Encoding: chunked\r\n",
        CHUNKS,
        length=False,
        line=b"POST /v1/chat/completions HTTP/1.0",
    ),
    # chunk framing
    "chunk size uppercase hex": chunked(BODY * 4).replace(b"%x" % (N * 4), b"%X" % (N * 4)),
    "chunk size leading zeros": req(
        b"Transfer-Encoding: chunked\r\n", b"000%x\r\n%b\r\n0\r\n\r\n" % (N, BODY), length=False
    ),
    "chunk size plus": req(
        b"Transfer-Encoding: chunked\r\n", b"+%x\r\n%b\r\n0\r\n\r\n" % (N, BODY), length=False
    ),
    "chunk size negative": req(
        b"Transfer-Encoding: chunked\r\n", b"-%x\r\n%b\r\n0\r\n\r\n" % (N, BODY), length=False
    ),
    "chunk size 0x": req(
        b"Transfer-Encoding: chunked\r\n", b"0x%x\r\n%b\r\n0\r\n\r\n" % (N, BODY), length=False
    ),
    "chunk size non-hex": req(
        b"Transfer-Encoding: chunked\r\n", b"zz\r\nab\r\n0\r\n\r\n", length=False
    ),
    "chunk size huge": req(
        b"Transfer-Encoding: chunked\r\n", b"ffffffffffffffffff\r\nab\r\n0\r\n\r\n", length=False
    ),
    "chunk size trailing space": req(
        b"Transfer-Encoding: chunked\r\n", b"%x \r\n%b\r\n0\r\n\r\n" % (N, BODY), length=False
    ),
    "chunk extension": req(
        b"Transfer-Encoding: chunked\r\n",
        b"%x;name=value\r\n%b\r\n0\r\n\r\n" % (N, BODY),
        length=False,
    ),
    "chunk extension quoted": req(
        b"Transfer-Encoding: chunked\r\n",
        b'%x;a="b;c"\r\n%b\r\n0\r\n\r\n' % (N, BODY),
        length=False,
    ),
    "chunk extension bare LF": req(
        b"Transfer-Encoding: chunked\r\n", b"%x;a\nb\r\n%b\r\n0\r\n\r\n" % (N, BODY), length=False
    ),
    "chunk data too long": req(
        b"Transfer-Encoding: chunked\r\n", b"2\r\nabc\r\n0\r\n\r\n", length=False
    ),
    "chunk bare LF": req(
        b"Transfer-Encoding: chunked\r\n", b"%x\n%b\n0\n\n" % (N, BODY), length=False
    ),
    "trailers": req(
        b"Transfer-Encoding: chunked\r\n",
        b"%x\r\n%b\r\n0\r\nX-Trailer: 1\r\n\r\n" % (N, BODY),
        length=False,
    ),
    "trailer content-length": req(
        b"Transfer-Encoding: chunked\r\n",
        b"%x\r\n%b\r\n0\r\nContent-Length: 3\r\n\r\n" % (N, BODY),
        length=False,
    ),
    "chunked then smuggled": req(
        b"Transfer-Encoding: chunked\r\n", CHUNKS + SMUGGLED, length=False
    ),
    # Content-Length values
    "length negative": req("Content-Length: -1\r\n", length=False),
    "length plus": req(f"Content-Length: +{N}\r\n", length=False),
    "length non-numeric": req("Content-Length: abc\r\n", length=False),
    "length hex": req(f"Content-Length: 0x{N:x}\r\n", length=False),
    "length empty": req("Content-Length:\r\n", length=False),
    "length with inner space": req(f"Content-Length: {N // 10} {N % 10}\r\n", length=False),
    "length underscore": req("Content-Length: 1_0\r\n", b"0123456789", length=False),
    "length exponent": req("Content-Length: 1e1\r\n", b"0123456789", length=False),
    "length unicode digits": req(
        "Content-Length: \u0661\u0660\r\n".encode(), b"0123456789", length=False
    ),
    "length huge": req("Content-Length: 99999999999999999999999\r\n", length=False),
    "length too large": req(b"", b"x" * (LIMIT + 1)),
    "length at the limit": req(b"", b"x" * LIMIT),
    "length shorter than body": req(f"Content-Length: {N - 5}\r\n", length=False),
    "length longer than body": req(f"Content-Length: {N + 5}\r\n", length=False),
    "length name space": req(f"Content-Length : {N}\r\n", length=False),
    "length name uppercase": req(f"CONTENT-LENGTH: {N}\r\n", length=False),
    "no length on POST": req(length=False, body=b""),
    # obs-fold continuation lines
    "obs-fold value": req(b"X-A: one\r\n two\r\n"),
    "obs-fold tab": req(b"X-A: one\r\n\ttwo\r\n"),
    "obs-fold length": req(b"Content-Length: \r\n %d\r\n" % N, length=False),
    "obs-fold after length": req(b"Content-Length: %d\r\n 5\r\n" % N, length=False),
    "obs-fold TE": req(b"X-A: b\r\n Transfer-Encoding: chunked\r\n"),
    "first header folded": req(host=b" Host: gw\r\n"),
    # bare LF / CR line endings
    "bare LF everywhere": req().replace(b"\r\n", b"\n"),
    "bare LF request line": req().replace(b"HTTP/1.1\r\n", b"HTTP/1.1\n", 1),
    "bare LF in one header": req().replace(b"Host: gw\r\n", b"Host: gw\n"),
    "bare LF end of head": req()[: -N - 2] + b"\n" + BODY,
    "bare CR in header": req(b"X-A: a\rb\r\n"),
    "bare CR line end": req(b"X-A: a\r\rX-B: b\r\n"),
    "LF CR line end": req().replace(b"Host: gw\r\n", b"Host: gw\n\r"),
    "bare LF hides TE": req(b"X-A: a\nTransfer-Encoding: chunked\r\n"),
    "bare LF hides CL": req(b"X-A: a\nContent-Length: 3\r\n"),
    "bare LF hides CL 2": req(b"X-A: a\nContent-Length: 3\r\n", length=False),
    "leading CRLF": b"\r\n" + req(),
    "leading LF": b"\n" + req(),
    # NUL and control bytes
    "NUL in method": req(line=b"PO\x00ST /v1/chat/completions HTTP/1.1"),
    "NUL in path": req(line=b"POST /v1/chat/completions\x00 HTTP/1.1"),
    "NUL in version": req(line=b"POST /v1/chat/completions HTTP/1.1\x00"),
    "NUL in header name": req(b"X-\x00A: b\r\n"),
    "NUL in header value": req(b"X-A: b\x00c\r\n"),
    "NUL in length": req(b"Content-Length: %d\x00\r\n" % N, length=False),
    "NUL in TE": req(b"Transfer-Encoding: chunked\x00\r\n", CHUNKS, length=False),
    "DEL in header value": req(b"X-A: b\x7fc\r\n"),
    "ESC in header value": req(b"X-A: b\x1bc\r\n"),
    "VT in header value": req(b"X-A: b\x0bc\r\n"),
    "FF in header value": req(b"X-A: b\x0cc\r\n"),
    "control in header name": req(b"X-\x01A: b\r\n"),
    "DEL in header name": req(b"X-\x7fA: b\r\n"),
    "space in header name": req(b"X A: b\r\n"),
    "empty header name": req(b": b\r\n"),
    "no colon": req(b"X-A b\r\n"),
    "high bytes in value": req(b"X-A: caf\xc3\xa9\r\n"),
    "high bytes in name": req(b"X-\xc3\xa9: b\r\n"),
    "control in path": req(line=b"POST /v1/chat/\x01completions HTTP/1.1"),
    "DEL in path": req(line=b"POST /v1/chat/completions\x7f HTTP/1.1"),
    "high byte in path": req(line=b"POST /v1/chat/completions\xff HTTP/1.1"),
    "value trailing whitespace": req(b"X-A: b \t \r\n"),
    "value inner tab": req(b"X-A: b\tc\r\n"),
    # over-long request lines and heads
    "request line at the limit": req(
        line=b"POST /v1/chat/completions?" + b"a" * 8155 + b" HTTP/1.1"
    ),
    "request line over the limit": req(
        line=b"POST /v1/chat/completions?" + b"a" * 8200 + b" HTTP/1.1"
    ),
    "header at the limit": req(b"X-Long: " + b"a" * 8180 + b"\r\n"),
    "header over the limit": req(b"X-Long: " + b"a" * 8200 + b"\r\n"),
    "head just under 8190": req(b"X-Long: " + b"a" * 8060 + b"\r\n"),
    "head just over 8190": req(b"X-Long: " + b"a" * 8100 + b"\r\n"),
    "many short headers": req(b"".join(b"X-H%d: v\r\n" % i for i in range(60))),
    "99 headers": req(b"".join(b"X-H%d: v\r\n" % i for i in range(96))),
    "101 headers": req(b"".join(b"X-H%d: v\r\n" % i for i in range(98))),
    "129 headers": req(b"".join(b"X-H%d: v\r\n" % i for i in range(126))),
    "long head over many lines": req(
        b"".join(b"X-H%d: %b\r\n" % (i, b"v" * 200) for i in range(60))
    ),
    "repeated x header": req(b"X-A: 1\r\nX-A: 2\r\n"),
    # special headers
    "expect": req(b"Expect: 100-continue\r\n"),
    "upgrade": req(b"Connection: Upgrade\r\nUpgrade: websocket\r\n"),
    "upgrade no connection": req(b"Upgrade: h2c\r\n"),
    "content-encoding": req(b"Content-Encoding: identity\r\n"),
    "connection list": req(b"Connection: keep-alive, Upgrade\r\nUpgrade: x\r\n"),
    "connection uppercase": req(b"Connection: KEEP-ALIVE\r\n"),
    "sec-websocket-key1": req(b"Sec-WebSocket-Key1: 1\r\n"),
    "proxy-connection close": req(b"Proxy-Connection: close\r\n"),
    "proxy-connection keep-alive": req(b"Proxy-Connection: keep-alive\r\n"),
    "proxy-connection upgrade": req(b"Proxy-Connection: upgrade\r\nUpgrade: x\r\n"),
    "keep-alive header": req(b"Keep-Alive: timeout=5\r\n"),
    "long header name": req(b"X-" + b"n" * 7900 + b": v\r\n"),
    "value only spaces": req(b"X-A:    \r\n"),
    "host with tab": req(host=b"Host:\tgw\t\r\n"),
    "host with port and space": req(host=b"Host: gw :80\r\n"),
    # pipelined
    "two pipelined": req() + req(line=b"POST /v1/completions HTTP/1.1"),
    "three pipelined": req() + req(body=b"") + req(body=b"x"),
    "pipelined then other": req() + SMUGGLED + req(),
    "other then pipelined": SMUGGLED + req() + req(),
    "pipelined then bad": req() + b"BAD\r\n\r\n" + req(),
    "pipelined then chunked": req() + chunked() + req(),
    "short length smuggles": req(b"Content-Length: 0\r\n", SMUGGLED, length=False),
    "body is a request": req(body=SMUGGLED) + req(),
    "pipelined two lengths": req() + req("Content-Length: 0\r\n") + req(),
    "pipelined TE and CL": req() + req(b"Transfer-Encoding: chunked\r\n", b"0\r\n\r\n" + SMUGGLED),
    "pipelined bare LF": req() + req().replace(b"\r\n", b"\n") + req(),
    # garbage
    "empty": b"",
    "only CRLF": b"\r\n\r\n",
    "not HTTP": b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03",
    "head never ends": req()[: -N - 2],
    "partial request line": b"POST /v1/chat/completions HTT",
}

# the hand-picked cases whose (first) request the front parses itself
TAKEN = frozenset(
    {
        "plain",
        "plain completions",
        "empty body",
        "zero length, no body",
        "leading zeros length",
        "length with spaces",
        "length with tab",
        "keep-alive",
        "connection uppercase",
        "empty host",
        "host with tab",
        "host with port and space",
        "TE name underscore",  # not a Transfer-Encoding to aiohttp either
        "length at the limit",
        "length shorter than body",
        "length longer than body",
        "length name uppercase",
        "value trailing whitespace",
        "value inner tab",
        "value only spaces",
        "keep-alive header",
        "long header name",
        "head just under 8190",
        "many short headers",
        "99 headers",
        "two pipelined",
        "three pipelined",
        "pipelined then other",
        "pipelined then bad",
        "pipelined then chunked",
        "short length smuggles",
        "body is a request",
        "pipelined two lengths",
        "pipelined TE and CL",
        "pipelined bare LF",
    }
)

# The allowed direction: hot-path requests aiohttp accepts that the front refuses to
# parse. Refusing is handing the connection to aiohttp, which then answers exactly as
# without the front, and it is the safer choice for each: the front never judges a
# framing, a coding or a header aiohttp reads specially, nor a head near its limits.
STRICTER = {
    "chunked": "Transfer-Encoding of any kind: only aiohttp decodes chunks",
    "chunked uppercase": "Transfer-Encoding",
    "chunked leading space": "Transfer-Encoding",
    "identity, chunked": "Transfer-Encoding",
    "TE header name uppercase": "Transfer-Encoding",
    "chunk extension": "Transfer-Encoding",
    "trailers": "Transfer-Encoding",
    "no length on POST": "no Content-Length: aiohttp decides what the body is",
    "content-encoding": "Content-Encoding: aiohttp decompresses",
    "expect": "Expect: aiohttp answers 100 Continue (or 417)",
    "upgrade": "Upgrade: aiohttp's to judge",
    "upgrade no connection": "Upgrade",
    "proxy-connection keep-alive": "Proxy-Connection: llhttp reads it as Connection",
    "connection list": "Connection other than keep-alive",
    "repeated x header": "a repeated header: aiohttp refuses some repeats, merges none",
    "high bytes in value": "obs-text: the front reads printable ASCII only",
    "101 headers": "over 100 headers (aiohttp allows 128)",
    "head just over 8190": "a head over 8190 bytes (aiohttp limits each line only)",
    "header at the limit": "a head over 8190 bytes",
    "long head over many lines": "a head over 8190 bytes",
    "leading CRLF": "bytes before the request line: aiohttp skips empty lines",
    "query": "anything but the exact hot request line",
    "absolute form": "anything but the exact hot request line",
}

# --------------------------------------------------------------------------------------
# the seeded mutator

CORPUS = [
    req(),
    req(b"X-Request-Id: abc\r\nAccept: */*\r\n", line=b"POST /v1/completions HTTP/1.1"),
    req(b"Connection: keep-alive\r\n", b""),
    req() + req(body=b"{}"),
    req(b"User-Agent: t\r\n", b"x" * 300),
    chunked(),
    req(b"", b"0123456789") + SMUGGLED,
]
HEADER_TOKENS = [
    b"Content-Length: 3\r\n",
    b"Content-Length: 0\r\n",
    b"Transfer-Encoding: chunked\r\n",
    b"Transfer-Encoding: chunked, identity\r\n",
    b"Connection: close\r\n",
    b"Connection: keep-alive\r\n",
    b"Proxy-Connection: close\r\n",
    b"Upgrade: websocket\r\n",
    b"Expect: 100-continue\r\n",
    b"Content-Encoding: gzip\r\n",
    b"Host: other\r\n",
]
TOKENS = [
    b"\r\n",
    b"\n",
    b"\r",
    b"\x00",
    b"\t",
    b" ",
    b":",
    b",",
    b"+",
    b"-",
    b"0",
    b"\x7f",
    b"\x80",
    b"\x0b",
    b"\r\n ",
    b"\r\n\r\n",
    b"0\r\n\r\n",
    SMUGGLED,
    *HEADER_TOKENS,
]


def _lines(data: bytes) -> tuple[list[bytes], bytes]:
    head, sep, rest = data.partition(b"\r\n\r\n")
    return head.split(b"\r\n"), rest if sep else b""


def mutate(rng: random.Random, data: bytes) -> bytes:
    op = rng.randrange(11)
    if not data:
        return rng.choice(TOKENS)
    at = rng.randrange(len(data) + 1)
    if op == 0:  # insert a token
        return data[:at] + rng.choice(TOKENS) + data[at:]
    if op == 1:  # replace a byte
        return data[:at] + rng.choice(TOKENS)[:1] + data[at + 1 :]
    if op == 2:  # delete a span
        return data[:at] + data[at + rng.randint(1, 4) :]
    if op == 3:  # one CRLF to a bare LF or CR
        spots = [m.start() for m in re.finditer(rb"\r\n", data)]
        if spots:
            at = rng.choice(spots)
            return data[:at] + rng.choice((b"\n", b"\r", b"\n\r")) + data[at + 2 :]
        return data
    lines, rest = _lines(data)
    if len(lines) < 2:
        return data[:at] + rng.choice(TOKENS) + data[at:]
    pick = rng.randrange(1, len(lines))
    line = lines[pick]
    if op == 4:  # repeat a header line
        lines.insert(pick, line)
    elif op == 5:  # fold it onto the line before
        lines[pick] = rng.choice((b" ", b"\t")) + line
    elif op == 6:  # flip the case of a header line
        lines[pick] = line.upper() if rng.random() < 0.5 else line.swapcase()
    elif op == 7:  # whitespace around the colon
        name, _, value = line.partition(b":")
        lines[pick] = name + rng.choice((b" ", b"\t", b"")) + b":" + rng.choice((b"", b"  ", b"\t"))
        lines[pick] += value.strip()
    elif op == 8:  # shift the Content-Length
        for i, candidate in enumerate(lines):
            if candidate.lower().startswith(b"content-length:"):
                digits = re.search(rb"\d+", candidate)
                value = int(digits.group()) if digits else 0
                shifted = rng.choice((value - 1, value + 1, -value, 0, value * 2))
                lines[i] = b"Content-Length: %b" % rng.choice(
                    (b"%d" % shifted, b"+%d" % value, b"%d, %d" % (value, shifted), b" %d" % value)
                )
                break
    elif op == 9:  # a framing header line
        lines.insert(pick, rng.choice(HEADER_TOKENS).rstrip(b"\r\n"))
    else:  # the request line's spaces and version
        parts = lines[0].split(b" ")
        if len(parts) == 3:
            parts[rng.randrange(3)] = rng.choice(
                (b"HTTP/1.0", b"POST", b"GET", b"/v1/completions", b"HTTP/1.1 ", b"", b"post")
            )
            lines[0] = b" ".join(parts)
    return b"\r\n".join(lines) + b"\r\n\r\n" + rest


def mutated_cases(count: int = MUTATED, seed: int = SEED) -> dict[str, bytes]:
    rng = random.Random(seed)
    cases = {}
    for i in range(count):
        data = rng.choice(CORPUS)
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            data = mutate(rng, data)
        cases[f"mutated {i}"] = data
    return cases


# --------------------------------------------------------------------------------------
# the property


def split(stream: bytes) -> list[bytes]:
    """The answers in a stream (interim ones, the rest with a Content-Length); a broken
    tail last."""
    out = []
    while stream:
        end = stream.find(b"\r\n\r\n")
        if end >= 0 and re.match(rb"HTTP/1\.1 1\d\d ", stream):  # interim: no body
            out.append(stream[: end + 4])
            stream = stream[end + 4 :]
            continue
        found = re.search(rb"\r\nContent-Length: (\d+)\r\n", stream[: end + 2])
        if end < 0 or found is None:
            out.append(stream)
            break
        size = end + 4 + int(found.group(1))
        out.append(stream[:size])
        stream = stream[size:]
    return out


def _refusal(answer: bytes) -> bytes:
    """A 400 (only aiohttp's parser answers one here) without its text: the text quotes
    what the parser held when it gave up, which follows how the bytes were read."""
    status = answer.split(b"\r\n", 1)[0]
    return b"%b (...)" % status if status.endswith(b" 400 Bad Request") else answer


def fewer(more: list[bytes], less: list[bytes]) -> bool:
    """``less`` is ``more``, or ``more`` less some answers right before the final 400
    both end with: aiohttp's server refuses every request of a segment it read when one
    of them is bad (its parser raises for the whole segment), so how the bytes arrive
    decides how many of the requests before a bad one it answers."""
    if more == less:
        return True
    if not less or len(less) >= len(more) or not less[-1].startswith(b"HTTP/1.0 400"):
        return False
    return more[-1] == less[-1] and more[: len(less) - 1] == less[:-1]


def _own(stream: bytes) -> list[bytes]:
    return [answer for answer in split(stream) if _VIA in answer]


def differences(names: list[str], got: list[list[bytes | None]]) -> list[str]:
    """The cases where the front answered otherwise than aiohttp's server fed the same
    bytes in one segment — except where aiohttp answers fewer of the requests before a
    bad one (``fewer``) and the front answers as aiohttp fed the same bytes cut where
    the front's requests end. The front fed byte by byte must answer the requests it
    takes as the front fed what arrives (what it hands over is aiohttp's to answer, as
    the bytes arrive)."""
    out = []
    for name, raw, raw_bytewise, raw_whole, raw_cut in zip(names, *got, strict=True):
        assert raw is not None and raw_bytewise is not None and raw_whole is not None
        front, whole = (
            [_refusal(a) for a in split(s.replace(_VIA, b""))] for s in (raw, raw_whole)
        )
        cut = [_refusal(a) for a in split(raw_cut.replace(_VIA, b""))] if raw_cut else None
        if front != whole and not (fewer(front, whole) and front == cut):
            out.append(
                f"{name} ({taken(raw)} taken):\n  front    {front!r}\n"
                f"  aiohttp  {whole!r}\n  aiohttp, cut where the front's requests end {cut!r}"
            )
        if _own(raw_bytewise) != _own(raw):
            out.append(
                f"{name}: the front fed byte by byte took otherwise\n"
                f"  {_own(raw_bytewise)!r}\n  {_own(raw)!r}"
            )
    return out


async def _run(
    cases: dict[str, bytes], sentinel: bool = True
) -> tuple[list[str], list[list[bytes | None]], Server]:
    """The answers of the front, the front fed byte by byte, aiohttp's server, and (where
    the front's answers differ from its) aiohttp's fed the same bytes cut where the
    front's requests end."""
    names = list(cases)
    data = [cases[name] for name in names]
    async with (
        serving("front") as front,
        serving("front-bytewise") as front_bytewise,
        serving("aiohttp") as plain,
    ):
        servers = (front, front_bytewise, plain)
        got = await asyncio.gather(*(answers(server.port, data, sentinel) for server in servers))

        async def cut(index: int) -> bytes | None:
            lean, whole = got[0][index], got[2][index]
            if lean.replace(_VIA, b"") == whole or not taken(lean):
                return None
            return await exchange(plain.port, data[index], sentinel, front_cuts(data[index], lean))

        cuts = await asyncio.gather(*(cut(index) for index in range(len(data))))
    return names, [*got, cuts], front


@pytest.mark.parametrize("sentinel", [True, False], ids=["then-sentinel", "alone"])
@pytest.mark.parametrize("kind", ["c", "py"])
async def test_hand_picked_cases_answer_as_aiohttp(kind: str, sentinel: bool) -> None:
    with parser(kind):
        names, got, _ = await _run(CASES, sentinel)
    assert not (found := differences(names, got)), "\n".join(found)
    lean, whole = dict(zip(names, got[0], strict=True)), dict(zip(names, got[2], strict=True))
    if sentinel:  # which it took itself, which it handed over though aiohttp accepts them
        assert {name for name in names if taken(lean[name])} == TAKEN
        for name in STRICTER:
            assert not taken(lean[name]), name
            assert re.match(rb"HTTP/1\.1 [12]\d\d ", whole[name]), name


@pytest.mark.parametrize("kind", ["c", "py"])
async def test_mutated_cases_answer_as_aiohttp(kind: str) -> None:
    cases = mutated_cases()
    with parser(kind):
        names, got, front = await _run(cases)
    assert not (found := differences(names, got)), "\n".join(found)
    assert front.served.value >= MUTATED // 10  # the mutations do reach the front's parser


def _statuses(stream: bytes) -> list[bytes]:
    return [_refusal(answer).split(b"\r\n", 1)[0] for answer in split(stream)]


async def test_the_gateway_answers_alike_with_and_without_the_front() -> None:
    """The real gateway (its routes, middlewares and proxying to an engine), each
    hand-picked case alone on a connection: the same statuses, in the same order, with
    the lean front on as off (aiohttp's C parser; the echo tests compare the bytes)."""
    with engines(1, separate=False) as started:
        config = {
            "nodes": [{"id": "e0", "url": started[0].url}],
            "server": {"max_body_bytes": LIMIT},
        }
        got = []
        for lean in (True, False):
            async with running_gateway(
                {**config, "server": {**config["server"], "lean_front": lean}}
            ) as gw:
                port = int(gw.url.rsplit(":", 1)[1])
                got.append(await answers(port, list(CASES.values()), sentinel=False))
                if lean:
                    served = gw.gateway.registry.get_sample_value(
                        "kvgate_front_lean_requests_total"
                    )
                    assert served and served >= 20
    found = []
    for name, lean_stream, plain_stream in zip(CASES, *got, strict=True):
        front, whole = _statuses(lean_stream), _statuses(plain_stream)
        if not fewer(front, whole):
            found.append(f"{name}: front {front} aiohttp {whole}")
    assert not found, "\n".join(found)
