"""A sidecar-registered engine joins a running gateway (no restart) and leaves on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp

from tests.fixtures.engines import EngineProcess
from tests.fixtures.gateway import GatewayProcess
from tests.fixtures.poll import poll_until
from tests.sidecar.conftest import SidecarProcess


async def gateway_nodes(session: aiohttp.ClientSession, gw: GatewayProcess) -> dict[str, Any]:
    async with session.get(f"{gw.url}/admin/nodes") as resp:
        assert resp.status == 200, await resp.text()
        return {row["node_id"]: row for row in (await resp.json())["nodes"]}


async def poll(
    session: aiohttp.ClientSession,
    gw: GatewayProcess,
    predicate: Callable[[dict[str, Any]], bool],
    limit_s: float,
) -> dict[str, Any]:
    return await poll_until(
        lambda: gateway_nodes(session, gw),
        predicate,
        limit_s,
        what="gateway nodes",
        detail=lambda: "\n" + gw.log()[-3000:],
    )


async def test_gateway_routes_to_a_sidecar_registered_node_until_it_leaves(
    redis_server: Any,
    sim_engines: Callable[..., EngineProcess],
    gateway_factory: Callable[..., GatewayProcess],
    sidecars: Callable[..., SidecarProcess],
) -> None:
    gw = gateway_factory(extra_args=["--store", redis_server.url])
    engine = sim_engines()
    node_id = f"joined-{uuid.uuid4().hex[:8]}"
    side = sidecars(engine.url, redis_server.url, node_id, "--drain-timeout", "10")
    async with aiohttp.ClientSession() as session:
        nodes = await poll(session, gw, lambda n: node_id in n, 20)
        assert nodes[node_id]["url"] == engine.url and nodes[node_id]["source"] == "registry"
        body = {"model": nodes[node_id]["model"], "prompt": "hello " * 40, "max_tokens": 4}
        async with session.post(f"{gw.url}/v1/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            assert resp.headers["X-KVGate-Node"] == node_id
        side.process.send_signal(signal.SIGTERM)
        await poll(session, gw, lambda n: node_id not in n, 20)
    assert await asyncio.to_thread(side.process.wait, 15) == 0, side.log()
