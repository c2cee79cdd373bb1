"""The malformed inputs of issue 11, each answered with a 4xx before admission."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from tests.fixtures.gateway import InProcessGateway, running_gateway
from tests.gateway._engines import engines

ADMIN = {"Authorization": "Bearer adm"}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def engine_url() -> Iterator[str]:
    with engines(1) as started:
        yield started[0].url


@pytest.fixture
async def gw(engine_url: str) -> AsyncIterator[InProcessGateway]:
    config = {"nodes": [{"id": "e0", "url": engine_url}], "auth": {"admin_token": "adm"}}
    async with running_gateway(config) as gateway:
        yield gateway


def deep(n: int) -> bytes:
    return ('{"messages":' + "[" * n + "]" * n + "}").encode()


CASES: list[tuple[str, str, bytes, dict[str, str], int, str]] = [
    ("deep", "/v1/chat/completions", deep(1000), {}, 400, "too_deep"),
    ("deep bare", "/v1/completions", b"[" * 100_000 + b"]" * 100_000, {}, 400, "too_deep"),
    ("deep admin", "/admin/flags", deep(1000), ADMIN, 400, "too_deep"),
    (
        "lone surrogate",
        "/v1/chat/completions",
        b'{"messages":[{"role":"user","content":"\\ud800"}]}',
        {},
        400,
        "invalid_encoding",
    ),
    (
        "encoded surrogate",
        "/v1/chat/completions",
        b'{"messages":[{"role":"user","content":"\xed\xa0\x80"}]}',
        {},
        400,
        "invalid_encoding",
    ),
    ("latin-1", "/v1/completions", b'{"prompt":"caf\xe9"}', {}, 400, "invalid_encoding"),
    (
        "gzip header, plain body",
        "/v1/chat/completions",
        json.dumps(CHAT).encode(),
        {"Content-Encoding": "gzip"},
        400,
        "bad_encoding",
    ),
    (
        "deflate header, gzip body",
        "/v1/chat/completions",
        gzip.compress(json.dumps(CHAT).encode()),
        {"Content-Encoding": "deflate"},
        400,
        "bad_encoding",
    ),
    (
        "unknown encoding",
        "/v1/chat/completions",
        json.dumps(CHAT).encode(),
        {"Content-Encoding": "compress"},
        415,
        "unsupported_encoding",
    ),
    ("NaN", "/v1/completions", b'{"prompt":"x","temperature":NaN}', {}, 400, "invalid_json"),
    ("huge int", "/v1/completions", b'{"prompt":"x","max_tokens":1' + b"0" * 30 + b"}", {}, 400, "invalid_value"),
    ("stream type", "/v1/completions", b'{"prompt":"x","stream":"yes"}', {}, 400, "invalid_type"),
    (
        "stream_options type",
        "/v1/completions",
        b'{"prompt":"x","stream":true,"stream_options":[1]}',
        {},
        400,
        "invalid_type",
    ),
    ("tools type", "/v1/chat/completions", b'{"messages":[{"role":"user","content":"x"}],"tools":{"a":1}}', {}, 400, "invalid_type"),
    ("temperature type", "/v1/completions", b'{"prompt":"x","temperature":"hot"}', {}, 400, "invalid_type"),
    ("message type", "/v1/chat/completions", b'{"messages":["hi"]}', {}, 400, "invalid_type"),
    ("prompt type", "/v1/completions", b'{"prompt":{"a":1}}', {}, 400, "invalid_type"),
    ("flags deep value", "/admin/flags", b'{"cache_affinity":[[[[1]]]]}', ADMIN, 400, "invalid_value"),
    ("odd Expect", "/v1/completions", b'{"prompt":"x"}', {"Expect": "\u00ecx"}, 417, "expectation_failed"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "data", "headers", "status", "code"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
async def test_malformed_input_is_4xx_before_admission(
    gw: InProcessGateway, path: str, data: bytes, headers: dict[str, str], status: int, code: str
) -> None:
    decisions_before = _decisions(gw)
    async with (
        aiohttp.ClientSession(auto_decompress=False) as s,
        s.post(
            gw.url + path, data=data, headers={"Content-Type": "application/json", **headers}
        ) as r,
    ):
        body: Any = await r.json(content_type=None)
    assert r.status == status, body
    assert body["error"]["code"] == code
    assert body["error"]["type"] == "invalid_request_error"
    assert _decisions(gw) == decisions_before  # nothing reached admission


async def test_compressed_bodies_are_served(gw: InProcessGateway) -> None:
    # long enough to arrive in several reads
    raw = json.dumps({**CHAT, "user": "u" * 300_000}).encode()
    async with aiohttp.ClientSession() as s:
        for encoding, data in [
            ("gzip", gzip.compress(raw)),
            ("deflate", zlib.compress(raw)),
            ("gzip, identity", gzip.compress(raw)),
            ("x-gzip", gzip.compress(raw)),
            ("deflate, gzip", gzip.compress(zlib.compress(raw))),
            ("identity", raw),
        ]:
            async with s.post(
                gw.url + "/v1/chat/completions", data=data, headers={"Content-Encoding": encoding}
            ) as r:
                assert r.status == 200, (encoding, await r.text())


@pytest.mark.parametrize("encoding", ["gzip", "gzip, identity"])
async def test_gzip_bomb_is_cut_at_the_body_limit(gw: InProcessGateway, encoding: str) -> None:
    bomb = gzip.compress(b'{"prompt":"' + b"a" * (64 * 1024 * 1024) + b'"}')
    async with (
        aiohttp.ClientSession() as s,
        s.post(gw.url + "/v1/completions", data=bomb, headers={"Content-Encoding": encoding}) as r,
    ):
        assert r.status == 413
        assert (await r.json())["error"]["code"] == "body_too_large"


def _decisions(gw: InProcessGateway) -> int:
    counts = gw.gateway.admission.snapshot()["decisions_total"]
    return sum(sum(v.values()) for v in counts.values())
