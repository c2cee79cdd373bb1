"""Nodes reference capacity profiles; the quota total is the serving nodes' sum."""

from __future__ import annotations

import asyncio
import io

import aiohttp
from rich.console import Console

from kvgate.calibrate.profile import CapacityProfile
from kvgate.status.view import nodes_table
from kvgate.store import open_store
from kvgate.store.keys import TOTAL_QUOTA
from kvgate.types import NodeState
from tests.fixtures.gateway import running_gateway

PROFILE = {
    "model_version": "gemma-v1",
    "deployment": "cpu-1t",
    "context": 512,
    "capacity_runtime_tokens": 4000,
    "knee_concurrency": 8,
    "ttft_p99_at_knee": 2.5,
    "measured_at": 1.0,
}


async def until(check, timeout: float = 3.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_total_is_the_sum_of_serving_calibrated_nodes(sim_engines) -> None:  # type: ignore[no-untyped-def]
    engines = sim_engines(count=2)
    store = open_store("memory://")
    config = {
        "nodes": [
            {
                "id": "n0",
                "url": engines.urls[0],
                "engine_type": "sim",
                "model_version": "gemma-v1",
                "deployment": "cpu-1t",
            },
            {"id": "n1", "url": engines.urls[1], "engine_type": "sim", "deployment": "cpu-1t"},
        ],
        "capacity_profiles": [PROFILE],
    }
    async with running_gateway(config, store=store) as gw:
        g = gw.gateway
        await until(lambda: g.admission.core.total == 4000)
        assert await store.get(TOTAL_QUOTA) == "4000"
        async with aiohttp.ClientSession() as s:
            async with s.get(gw.url + "/admin/summary") as r:
                nodes = {n["node_id"]: n for n in (await r.json())["nodes"]}
            async with s.get(gw.url + "/metrics") as r:
                metrics = await r.text()
        assert (nodes["n0"]["calibrated"], nodes["n0"]["capacity_tokens"]) == (True, 4000)
        assert nodes["n1"]["calibrated"] is False  # its model has no profile
        assert nodes["n1"]["capacity_profile"] == "google/gemma-3-270m-it@cpu-1t"
        assert 'kvgate_node_uncalibrated{node="n1"} 1.0' in metrics
        assert 'kvgate_node_uncalibrated{node="n0"} 0.0' in metrics
        assert "kvgate_calibrated_capacity_tokens 4000.0" in metrics
        out = io.StringIO()
        Console(file=out, width=250).print(nodes_table({"nodes": list(nodes.values())}))
        assert "uncalibrated" in out.getvalue()

        # kvgate calibrate --store writes n1's profile: the total follows at once
        n1 = CapacityProfile.from_dict(
            {**PROFILE, "model_version": "google/gemma-3-270m-it", "capacity_runtime_tokens": 3000}
        )
        await store.put(n1.key, n1.to_json())
        await until(lambda: g.admission.core.total == 7000)
        assert g.admission.dynamic.capacity() == 7000  # the dynamic quota measures this

        # a draining node no longer counts
        g.nodes.set_state("n0", NodeState.QUIESCING)
        await until(lambda: g.admission.core.total == 3000)
