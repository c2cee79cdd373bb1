"""Two gateways on one real etcd: apply on one, the other runs it within 2 s; rollback."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

TOKEN = "admin-secret"
KEY = "key-a"


def health(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/health", timeout=2) as r:
        return dict(json.loads(r.read()))


def wait_version(url: str, version: int, limit_s: float) -> float:
    """Seconds until the gateway at ``url`` reports ``version`` (fails after limit_s)."""
    start = time.monotonic()
    while time.monotonic() - start < limit_s:
        if health(url)["config_version"] == version:
            return time.monotonic() - start
        time.sleep(0.02)
    raise AssertionError(f"{url} still runs {health(url)['config_version']}, not {version}")


def kvgate_config(gateway: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "kvgate", "config", "--gateway", gateway, "--admin-token", TOKEN]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=30)


async def route_reason(session: aiohttp.ClientSession, url: str) -> str:
    body = {"prompt": "hello there", "max_tokens": 4, "ignore_eos": True}
    async with session.post(
        url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}
    ) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()
        return resp.headers["X-KVGate-Route-Reason"]


async def two_at_once(session: aiohttp.ClientSession, url: str) -> tuple[int, int]:
    """A long streamed request holds its reservation while a second one asks for room."""
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"prompt": "count slowly", "max_tokens": 600, "ignore_eos": True, "stream": True}
    async with session.post(url + "/v1/completions", json=body, headers=headers) as first:
        assert first.status == 200, await first.text()
        await first.content.readline()  # it is running: its tokens are reserved
        async with session.post(
            url + "/v1/completions", json={**body, "stream": False}, headers=headers
        ) as second:
            second_status = second.status
            await second.read()
        await first.read()
        return first.status, second_status


@pytest.mark.timeout(120)
def test_apply_on_one_gateway_reaches_the_other_and_rollback_restores(
    sim_engines, etcd_server, gateway_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    engines = sim_engines(count=2, time_scale=25.0)
    base = {
        "store": etcd_server.url,
        "auth": {"admin_token": TOKEN},
        "nodes": [
            {"id": f"n{i}", "url": u, "engine_type": "sim"} for i, u in enumerate(engines.urls)
        ],
        "routing": {"policy": "hybrid"},
        "admission": {
            "total_quota": 100000,
            "tenants": [{"name": "a", "api_keys": [KEY], "hard_cap": 1000}],
            "queue": {"max_queue_tokens": 0},
        },
    }
    gw1 = gateway_factory(config=base)
    gw2 = gateway_factory(config=base)
    v1 = health(gw1.url)["config_version"]
    assert v1 >= 1 and health(gw2.url)["config_version"] == v1  # one bootstrap version

    async def behaviour() -> tuple[str, tuple[int, int]]:
        async with aiohttp.ClientSession() as s:
            return await route_reason(s, gw2.url), await two_at_once(s, gw2.url)

    reason, statuses = asyncio.run(behaviour())
    assert reason != "round_robin"
    assert statuses == (200, 429)  # 2 x ~610 tokens > the cap of 1000
    marked = kvgate_config(gw2.url, "baseline", "known-good")
    assert marked.returncode == 0 and f"version {v1}" in marked.stdout, marked.stderr

    change = tmp_path / "change.yaml"
    change.write_text(
        yaml.safe_dump(
            {
                "routing": {"policy": "round_robin"},
                "admission": {
                    **base["admission"],
                    "tenants": [{"name": "a", "api_keys": [KEY], "hard_cap": 5000}],
                },
            }
        )
    )
    done = kvgate_config(gw1.url, "apply", str(change), "-m", "round robin, bigger cap")
    assert done.returncode == 0, done.stderr
    assert "routing.policy" in done.stdout and "hard_cap" in done.stdout
    v2 = v1 + 1
    assert health(gw1.url)["config_version"] == v2
    assert wait_version(gw2.url, v2, 2.0) <= 2.0
    time.sleep(0.2)  # the tenant quota key travels through etcd's watch as well
    reason, statuses = asyncio.run(behaviour())
    assert reason == "round_robin"
    assert statuses == (200, 200)

    done = kvgate_config(gw1.url, "rollback")
    assert done.returncode == 0, done.stderr
    assert wait_version(gw2.url, v1, 2.0) <= 2.0
    time.sleep(0.2)
    reason, statuses = asyncio.run(behaviour())
    assert reason != "round_robin"
    assert statuses == (200, 429)

    # history and diff through the CLI
    hist = json.loads(kvgate_config(gw2.url, "--json", "history").stdout)
    assert [v["version"] for v in hist["versions"]][-2:] == [v1, v2]
    assert hist["active"]["version"] == v1 and hist["running"] == v1
    diff = kvgate_config(gw2.url, "diff", "--from", str(v1), "--to", str(v2)).stdout
    assert '~ routing.policy: "hybrid" -> "round_robin"' in diff
    shown = json.loads(kvgate_config(gw2.url, "--json", "show").stdout)  # the active one
    assert shown["version"] == v1 and shown["document"]["routing"]["policy"] != "round_robin"
    latest = json.loads(kvgate_config(gw2.url, "--json", "diff").stdout)
    assert (latest["from"], latest["to"]) == (shown["parent"], v1)

    # forward again, then back to the named baseline
    assert kvgate_config(gw1.url, "rollback", "--to", str(v2)).returncode == 0
    assert wait_version(gw2.url, v2, 2.0) <= 2.0
    done = kvgate_config(gw2.url, "rollback", "--to-baseline", "known-good")
    assert done.returncode == 0, done.stderr
    assert wait_version(gw1.url, v1, 2.0) <= 2.0
    hist = json.loads(kvgate_config(gw2.url, "--json", "history").stdout)

    # an invalid apply changes nothing
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"routing": {"policy": "no_such_policy"}}))
    done = kvgate_config(gw1.url, "apply", str(bad))
    assert done.returncode == 1 and "routing.policy" in done.stderr
    hist2 = json.loads(kvgate_config(gw1.url, "--json", "history").stdout)
    assert hist2["versions"] == hist["versions"] and hist2["active"]["version"] == v1
