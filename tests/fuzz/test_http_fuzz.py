"""Property-based fuzz of the HTTP API: no client input gets an answer >= 500.

A real ``kvgate serve`` process in front of real simulated engines gets well over 1,000
generated malformed requests (bodies, headers, encodings, paths, methods) written on raw
sockets, so nothing in a client library cleans them up first. Every answer must be
below 500, the gateway must keep serving valid requests in between, and its resident
memory must stay flat.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import socket
import urllib.request
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fixtures.engines import start_engine_process
from tests.fixtures.gateway import GatewayProcess, start_gateway_process

ADMIN_TOKEN = "fuzz-admin"
EXAMPLES = 1_100
VALID_EVERY = 50  # a valid request after every this many malformed ones
RSS_GROWTH_LIMIT_KB = 24 * 1024  # bounded growth after warm-up (allocator arenas, caches)

PATHS = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/models",
    "/v1/jobs/x",
    "/health",
    "/admin/flags",
    "/admin/nodes/no-such-node/state",
    "/admin/summary",
    "/admin/config",
    "/v1/chat/completions/",
    "/v1//completions",
    "/%ff%fe",
    "/v1/chat/completions?x=%zz",
    "/" + "a" * 2000,
]
METHODS = ["POST", "POST", "POST", "GET", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "BREW"]
HEADER_NAMES = [
    "Content-Type",
    "Content-Encoding",
    "Authorization",
    "X-KVGate-Priority",
    "X-KVGate-Class",
    "X-KVGate-Tenant",
    "X-KB-Version",
    "X-Request-Id",
    "Prefer",
    "Accept",
    "Accept-Encoding",
    "Transfer-Encoding",
    "Expect",
]
ENCODINGS = ["gzip", "deflate", "br", "identity", "x-gzip", "compress", "zstd", "gzip, deflate"]


# -- strategies ---------------------------------------------------------------------
json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
GENERATION_FIELDS = [
    "model", "messages", "prompt", "tools", "max_tokens", "max_completion_tokens", "stream",
    "stream_options", "temperature", "top_p", "n", "stop", "seed", "priority", "user",
]  # fmt: skip


def valid_chat(text: str = "hello") -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}], "max_tokens": 2}


@st.composite
def mutated_body(draw: st.DrawFn) -> bytes:
    """A near-valid generation body with fields replaced, dropped or added."""
    body: dict[str, Any] = (
        valid_chat(draw(st.text(max_size=20)))
        if draw(st.booleans())
        else {"prompt": draw(st.text(max_size=20)), "max_tokens": 2}
    )
    for name in draw(st.lists(st.sampled_from(GENERATION_FIELDS), max_size=3)):
        body[name] = draw(json_values)
    if draw(st.booleans()) and body:
        body.pop(draw(st.sampled_from(sorted(body))))
    if "messages" in body and draw(st.booleans()):
        body["messages"] = [draw(json_values) for _ in range(draw(st.integers(0, 3)))]
    return json.dumps(body).encode()


@st.composite
def deep_body(draw: st.DrawFn) -> bytes:
    depth = draw(st.integers(min_value=60, max_value=20_000))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
    inner = opener * depth + "1" + closer * depth
    return ('{"messages":' + inner + "}").encode() if draw(st.booleans()) else inner.encode()


@st.composite
def text_encoding_body(draw: st.DrawFn) -> bytes:
    """Lone surrogates (escaped or encoded), invalid UTF-8, other encodings, BOMs."""
    content = draw(
        st.sampled_from(
            [
                b'"\\ud800"', b'"\\udfff x"', b'"a\\ud83d"', b'"\\uDC00"', b'"\xed\xa0\x80"',
                b'"\xff\xfe"', b'"\xc3"', b'"\xf4\x90\x80\x80"', b'"\x00"', b'"\\u0000"',
            ]
        )
    )  # fmt: skip
    raw = b'{"messages":[{"role":"user","content":' + content + b'}],"max_tokens":2}'
    mode = draw(st.sampled_from(["plain", "key", "utf16", "bom", "latin1"]))
    if mode == "key":
        raw = b"{" + content + b':1,"prompt":"x"}'
    elif mode == "utf16":
        raw = json.dumps(valid_chat("h\u00e9")).encode("utf-16")
    elif mode == "bom":
        raw = b"\xef\xbb\xbf" + raw
    elif mode == "latin1":
        raw = json.dumps(valid_chat("caf\u00e9"), ensure_ascii=False).encode("latin-1")
    return raw


bodies = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
    json_values.map(lambda v: json.dumps(v).encode()),
    mutated_body(),
    deep_body(),
    text_encoding_body(),
    st.just(b"{}"),
    st.just(b""),
    st.just(b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 1e400}'),
    st.just(b'{"prompt": "x", "max_tokens": NaN}'),
    st.just(b'{"prompt": "x", "max_tokens": 1' + b"0" * 5000 + b"}"),
)
header_value = st.one_of(
    st.sampled_from(["", "application/json", "text/plain", "Bearer x", "respond-async", "1",
                     "-1", "99999999999999999999", "chunked", "100-continue", "gzip"]),
    st.text(
        st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"),
        max_size=40,
    ),
)  # fmt: skip


@dataclass
class FuzzRequest:
    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes
    encoding: str | None = None
    raw_header_line: bytes | None = None


@st.composite
def fuzz_requests(draw: st.DrawFn) -> FuzzRequest:
    kind = draw(st.integers(0, 9))
    if kind < 5:  # most traffic where the parsing is: the generation endpoints
        method, path = "POST", draw(st.sampled_from(["/v1/chat/completions", "/v1/completions"]))
    elif kind < 7:
        method, path = "POST", draw(st.sampled_from(["/admin/flags", "/admin/nodes/e9/state"]))
    else:
        method = draw(st.sampled_from(METHODS))
        path = draw(st.sampled_from(PATHS) | st.text(min_size=1, max_size=30).map(_as_path))
    names = draw(st.lists(st.sampled_from(HEADER_NAMES), max_size=4, unique=True))
    headers = [(n, draw(header_value)) for n in names if n not in ("Content-Encoding",)]
    if path.startswith("/admin") and draw(st.integers(0, 3)) > 0:
        headers.append(("Authorization", f"Bearer {ADMIN_TOKEN}"))
    body = draw(bodies)
    encoding = None
    if "Content-Encoding" in names or draw(st.integers(0, 5)) == 0:
        encoding = draw(st.sampled_from(ENCODINGS) | st.text(max_size=12).map(_header_safe))
        body = _encode(
            body, draw(st.sampled_from(["match", "plain", "truncated", "double"])), encoding
        )
    raw_line = None
    if draw(st.integers(0, 9)) == 0:
        raw_line = draw(
            st.sampled_from(
                [b"X-Bad\x00Header: 1", b"Bad Header: x", b": novalue", b"X-Utf8: \xff\xfe",
                 b"Content-Length: abc", b"Content-Length: -1", b"Transfer-Encoding: gzip",
                 b"X" * 9000 + b": y", b"Host: a\rb"]
            )
        )  # fmt: skip
    return FuzzRequest(method, path, headers, body, encoding, raw_line)


def _as_path(text: str) -> str:
    quoted = urllib.request.quote(text, safe="/?=&%")
    return quoted if quoted.startswith("/") else "/" + quoted


def _header_safe(text: str) -> str:
    return "".join(c for c in text if 0x20 <= ord(c) < 0x7F)


def _encode(body: bytes, mode: str, encoding: str) -> bytes:
    if mode == "plain" or encoding not in ("gzip", "x-gzip", "deflate", "gzip, deflate"):
        return body
    compress = gzip.compress if "gzip" in encoding else zlib.compress
    packed = compress(body)
    if mode == "truncated":
        return packed[: max(1, len(packed) // 2)]
    if mode == "double":
        return compress(packed)
    return packed


# -- the wire -----------------------------------------------------------------------
def send(port: int, req: FuzzRequest, timeout: float = 5.0) -> int | None:
    """Write the request as raw bytes; the answer's status, or None if none came."""
    lines = [f"{req.method} {req.path} HTTP/1.1".encode(), b"Host: 127.0.0.1"]
    lines += [f"{name}: {value}".encode("latin-1") for name, value in req.headers]
    if req.encoding is not None:
        lines.append(f"Content-Encoding: {req.encoding}".encode("latin-1"))
    if req.raw_header_line is not None:
        lines.append(req.raw_header_line)
    body = req.body
    if any(n == "Transfer-Encoding" for n, _ in req.headers):
        body = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n" if body else b"0\r\n\r\n"
    else:
        lines.append(f"Content-Length: {len(body)}".encode())
    lines.append(b"Connection: close")
    payload = b"\r\n".join(lines) + b"\r\n\r\n" + body
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        with contextlib.suppress(OSError):  # it may answer and close before reading it all
            sock.sendall(payload)
        data = b""
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
    # skip an interim "100 Continue"
    while data.startswith(b"HTTP/1.1 100 ") and b"\r\n\r\n" in data:
        data = data.split(b"\r\n\r\n", 1)[1]
    if not data.startswith(b"HTTP/1."):
        return None
    return int(data.split(b" ", 2)[1])


def post_json(url: str, body: dict[str, Any], timeout: float = 20.0) -> int:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        resp.read()
        return int(resp.status)


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS line")


# -- the test -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def fuzz_gateway() -> Iterator[GatewayProcess]:
    engines = start_engine_process(count=2, time_scale=200.0)
    config = {
        "nodes": [{"id": f"e{i}", "url": u} for i, u in enumerate(engines.urls)],
        "auth": {"admin_token": ADMIN_TOKEN},
    }
    try:
        gw = start_gateway_process(config=config, extra_args=["--log-level", "warning"])
    except BaseException:
        engines.stop()
        raise
    try:
        yield gw
    finally:
        gw.stop()
        engines.stop()


@dataclass
class Tally:
    statuses: Counter[int | None] = field(default_factory=Counter)
    failures: list[tuple[int | None, FuzzRequest]] = field(default_factory=list)
    sent: int = 0


@pytest.mark.timeout(900)  # 1,100+ real requests; slow on a shared 2-core machine
def test_no_client_input_gets_5xx_and_gateway_keeps_serving(fuzz_gateway: GatewayProcess) -> None:
    gw = fuzz_gateway
    chat_url = gw.url + "/v1/chat/completions"
    for i in range(100):  # warm-up: imports, caches and pools fill before the RSS baseline
        assert post_json(chat_url, valid_chat(f"warm {i}")) == 200
    rss_before = rss_kb(gw.pid)
    tally = Tally()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(fuzz_requests())
    def one(req: FuzzRequest) -> None:
        status = send(gw.port, req)
        tally.sent += 1
        tally.statuses[status] += 1
        if status is not None and status >= 500:
            tally.failures.append((status, req))
        assert status is None or status < 500, f"{status} for {req!r}"
        if tally.sent % VALID_EVERY == 0:
            assert post_json(chat_url, valid_chat(f"still there {tally.sent}")) == 200

    one()
    assert tally.sent >= 1_000, tally.sent
    assert not tally.failures, tally.failures[:3]
    # most requests were answered (a handful of unparseable ones may just be closed)
    assert tally.statuses[None] <= tally.sent // 20, tally.statuses
    assert sum(n for s, n in tally.statuses.items() if s is not None and s < 300) > 0
    for i in range(20):
        assert post_json(chat_url, valid_chat(f"after {i}")) == 200
    with urllib.request.urlopen(gw.url + "/metrics", timeout=10) as resp:
        metrics = resp.read().decode()
    # every bad input was caught by the body checks, none by the last-resort middleware
    assert "kvgate_unexpected_errors_total{" not in metrics, metrics
    growth = rss_kb(gw.pid) - rss_before
    assert growth <= RSS_GROWTH_LIMIT_KB, f"RSS grew by {growth} kB over {tally.sent} requests"
    assert gw.process.poll() is None
    print(f"fuzz: {tally.sent} requests, statuses {dict(tally.statuses)}, RSS +{growth} kB")
