"""`kvgate serve` as a process: the id it gives itself on port 0, and with --workers: a
config version's tenant keys and classes reaching every proxy worker without a restart,
and /metrics serving every worker's figures as of the scrape."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from kvgate.procs import start_gateway_process
from tests.gateway._engines import MODEL, engines

ADMIN = {"Authorization": "Bearer s3cret"}
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _tenants(keys: list[str], classes: list[str]) -> dict[str, Any]:
    return {
        "tenants": [
            {"name": "acme", "api_keys": keys, "default_class": "batch", "classes": classes}
        ]
    }


@pytest.mark.parametrize("workers", [1, 2])
async def test_port_zero_names_the_bound_port(workers: int) -> None:
    gw = start_gateway_process(extra_args=["--workers", str(workers)])
    try:
        async with aiohttp.ClientSession() as s, s.get(gw.url + "/health") as r:
            health = await r.json()
        assert health["gateway"] == f"127.0.0.1:{gw.port}"
        assert gw.port != 0
    finally:
        gw.stop()


async def _statuses(url: str, headers: dict[str, str], n: int = 8) -> set[int]:
    """Statuses of ``n`` requests, each on its own connection (SO_REUSEPORT spreads
    connections, not requests, over the workers)."""
    out = set()
    for _ in range(n):
        async with (
            aiohttp.ClientSession() as s,
            s.post(url + "/v1/chat/completions", json=BODY, headers=headers) as r,
        ):
            out.add(r.status)
    return out


async def test_config_version_reaches_every_worker() -> None:
    config = {"auth": {"admin_token": "s3cret"}, "admission": _tenants(["k-old"], ["batch"])}
    gw = start_gateway_process(config=config, extra_args=["--workers", "2"])
    try:
        new_key = {"Authorization": "Bearer k-new"}
        interactive = {"Authorization": "Bearer k-old", "X-KVGate-Class": "interactive"}
        assert await _statuses(gw.url, new_key) == {401}
        assert await _statuses(gw.url, interactive) == {403}

        document = {"admission": _tenants(["k-old", "k-new"], ["batch", "interactive"])}
        async with (
            aiohttp.ClientSession() as s,
            s.post(gw.url + "/admin/config/apply", json={"document": document}, headers=ADMIN) as r,
        ):
            assert r.status == 201, await r.text()
        # the owner pushes the version to its workers as it applies it: allow only the
        # socket hop between them (no worker restart, no polling period)
        deadline = time.monotonic() + 2.0
        while True:
            after_key = await _statuses(gw.url, new_key)
            after_class = await _statuses(gw.url, interactive)
            if (401 not in after_key and 403 not in after_class) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        # no engine behind it: past the key and class checks the request fails later
        assert 401 not in after_key, after_key
        assert 403 not in after_class, after_class
    finally:
        gw.stop()


def _requests_total(text: str, status: str) -> float:
    want = f'kvgate_requests_total{{endpoint="/v1/chat/completions",status="{status}"}}'
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(want))


async def test_metrics_scrape_counts_every_finished_request_of_every_worker() -> None:
    # a scrape asks each worker for its figures first: no push period between a finished
    # request and the counters the owner serves
    with engines(1) as (engine,):
        gw = start_gateway_process(backends=[engine.url], extra_args=["--workers", "2"])
        try:
            for n in range(1, 7):
                async with (
                    aiohttp.ClientSession() as s,
                    s.post(gw.url + "/v1/chat/completions", json=CHAT) as r,
                ):
                    assert r.status == 200, await r.text()
                    await r.read()
                async with aiohttp.ClientSession() as s, s.get(gw.url + "/metrics") as r:
                    assert _requests_total(await r.text(), "200") == n
        finally:
            gw.stop()
