"""Tenant auth, priority limits, rejections and the async job path, through real engines."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from tests.fixtures.gateway import running_gateway
from tests.gateway._engines import engines

BODY = {"model": "sim", "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]}


def tenants_config(url: str, **admission: Any) -> dict[str, Any]:
    return {
        "nodes": [{"id": "e0", "url": url}],
        "admission": {
            "tenants": [
                {"name": "acme", "api_keys": ["k-acme"], "priority_min": 0, "priority_max": 5},
                {"name": "zeta", "api_keys": ["k-zeta"], "priority_min": 0, "priority_max": 1},
            ],
            **admission,
        },
    }


def key(k: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {k}"}


def chat(s: aiohttp.ClientSession, gw: Any, headers: dict[str, str] | None = None) -> Any:
    """POST ``BODY`` to the gateway's chat completions (use as ``async with``)."""
    return s.post(gw.url + "/v1/chat/completions", json=BODY, headers=headers)


@pytest.fixture(scope="module")
def engine():
    with engines(1) as (e,):
        yield e


async def test_api_keys_map_to_tenants(engine) -> None:
    async with running_gateway(tenants_config(engine.url)) as gw, aiohttp.ClientSession() as s:
        async with chat(s, gw) as r:
            assert r.status == 401
            assert (await r.json())["error"]["code"] == "invalid_api_key"
        async with chat(s, gw, key("wrong")) as r:
            assert r.status == 401
        async with chat(s, gw, key("k-acme")) as r:
            assert r.status == 200, await r.text()
        async with s.get(gw.url + "/v1/models") as r:
            assert r.status == 401


async def test_headers_cannot_raise_priority_or_switch_tenant(engine) -> None:
    async with running_gateway(tenants_config(engine.url)) as gw, aiohttp.ClientSession() as s:
        async with chat(s, gw, {**key("k-zeta"), "X-KVGate-Priority": "5"}) as r:
            assert r.status == 403
            assert "priority" in (await r.json())["error"]["message"]
        async with chat(s, gw, {**key("k-zeta"), "X-KVGate-Tenant": "acme"}) as r:
            assert r.status == 403
        async with chat(s, gw, {**key("k-acme"), "X-KVGate-Priority": "5"}) as r:
            assert r.status == 200


async def test_respond_async_job_is_kept_for_its_tenant(engine) -> None:
    async with running_gateway(tenants_config(engine.url)) as gw, aiohttp.ClientSession() as s:
        async with chat(s, gw, {**key("k-acme"), "Prefer": "respond-async"}) as r:
            assert r.status == 202
            location = r.headers["Location"]
            assert location.startswith("/v1/jobs/")
        async with s.get(gw.url + location, headers=key("k-zeta")) as r:
            assert r.status == 404
        for _ in range(200):
            async with s.get(gw.url + location, headers=key("k-acme")) as r:
                if r.status != 202:
                    break
            await asyncio.sleep(0.02)
        assert r.status == 200
        async with s.get(gw.url + location, headers=key("k-acme")) as r:
            body = await r.json()
        assert body["choices"][0]["message"]["content"]
