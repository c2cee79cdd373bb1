"""The last-resort middleware: no exception reaches the client as a traceback or a bare 500."""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from kvgate.gateway.errors import error_middleware, guard_edges
from kvgate.store.base import StoreUnavailable

SECRET = "internal detail /srv/secret.py line 42"


def raising(exc: BaseException) -> Callable[[web.Request], object]:
    async def handler(request: web.Request) -> web.Response:
        raise exc

    return handler


CASES = [
    ("recursion", RecursionError(SECRET), 400, "bad_request"),
    ("unicode", UnicodeEncodeError("utf-8", "\ud800", 0, 1, SECRET), 400, "bad_request"),
    ("zlib", zlib.error(SECRET), 400, "bad_request"),
    ("upstream", aiohttp.ClientConnectionError(SECRET), 502, "upstream_error"),
    ("store", StoreUnavailable(SECRET), 503, "store_unavailable"),
    ("bug", KeyError(SECRET), 500, "internal_error"),
]


@pytest.fixture
async def app_url() -> AsyncIterator[tuple[str, CollectorRegistry]]:
    app = web.Application(middlewares=[error_middleware])
    for name, exc, _, _ in CASES:
        app.router.add_post(f"/{name}", raising(exc))
    registry = CollectorRegistry()
    guard_edges(app, registry)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", registry
    finally:
        await runner.cleanup()


async def test_unexpected_exceptions_are_mapped_without_leaking(
    app_url: tuple[str, CollectorRegistry],
) -> None:
    url, registry = app_url
    async with aiohttp.ClientSession() as s:
        for name, _, status, code in CASES:
            async with s.post(f"{url}/{name}", data=b"{}") as r:
                text = await r.text()
                assert r.status == status, (name, text)
                assert (await r.json())["error"]["code"] == code
                assert SECRET not in text and "Traceback" not in text
        async with s.delete(f"{url}/bug") as r:
            assert r.status == 405 and (await r.json())["error"]["code"] == "method_not_allowed"
            assert r.headers["Allow"] == "POST"
        async with s.get(f"{url}/nowhere", headers={"Expect": "\u00ec"}) as r:
            assert r.status == 417 and (await r.json())["error"]["code"] == "expectation_failed"
    kinds = {
        s.labels["kind"]: s.value
        for m in registry.collect()
        if m.name == "kvgate_unexpected_errors"
        for s in m.samples
        if s.name.endswith("_total")
    }
    assert kinds == {"client_input": 3, "upstream": 1, "store_unavailable": 1, "internal": 1}
