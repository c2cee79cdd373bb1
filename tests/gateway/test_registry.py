"""Registry mode: a node a sidecar registers in the store appears and leaves with no restart."""

from __future__ import annotations

import asyncio

import aiohttp

from kvgate.store import open_store
from kvgate.store.keys import flag_key, node_key
from kvgate.types import NodeReport
from tests.fixtures.gateway import running_gateway
from tests.gateway._engines import engines

ADMIN = {"Authorization": "Bearer adm"}


async def node_ids(session: aiohttp.ClientSession, url: str) -> set[str]:
    async with session.get(url + "/admin/nodes", headers=ADMIN) as r:
        return {n["node_id"] for n in (await r.json())["nodes"]}


async def wait_for(predicate, timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(0.05)
    return False


async def test_sidecar_registered_node_comes_and_goes() -> None:
    store = open_store("memory://")
    config = {"auth": {"admin_token": "adm"}, "scrape": {"mode": "registry"}}
    with engines(1) as (engine,):
        async with running_gateway(config, store=store) as gw, aiohttp.ClientSession() as s:
            assert await node_ids(s, gw.url) == set()
            report = NodeReport(
                node_id="side-1", timestamp=0.0, url=engine.url, model="sim", engine_type="vllm"
            )
            await store.put(node_key("side-1"), report.to_json(), ttl=1.0)

            async def present() -> bool:
                return "side-1" in await node_ids(s, gw.url)

            assert await wait_for(present)
            body = {
                "model": "sim",
                "max_tokens": 2,
                "messages": [{"role": "user", "content": "hi"}],
            }
            async with s.post(gw.url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200, await r.text()
                assert r.headers["X-KVGate-Node"] == "side-1"

            async def gone() -> bool:
                return "side-1" not in await node_ids(s, gw.url)

            # nobody renews the lease: the key expires and the node leaves the gateway
            assert await wait_for(gone, timeout=10.0)
            async with s.post(gw.url + "/v1/chat/completions", json=body) as r:
                assert r.status == 503


async def test_flags_written_to_the_store_apply_live() -> None:
    store = open_store("memory://")
    async with running_gateway({}, store=store) as gw:
        assert gw.gateway.flags.enabled("cold_boost")
        await store.put(flag_key("cold_boost"), "off")
        for _ in range(100):
            if not gw.gateway.flags.enabled("cold_boost"):
                break
            await asyncio.sleep(0.02)
        assert not gw.gateway.flags.enabled("cold_boost")
