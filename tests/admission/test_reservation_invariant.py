"""Reservations never undercount: caps and the total hold under concurrency, at every moment.

200 concurrent mixed requests (interactive, economy-pool batch, async jobs; random
max_tokens, some without one) go through two live controllers sharing one store — a real
Redis server, or one memory store. A watcher task reads the store's per-tenant usage all
through the run and fails on any moment where a tenant holds more than its hard cap or
the cluster more than total × overcommit.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from kvgate.admission.config import AdmissionConfig
from kvgate.admission.controller import AdmissionController
from kvgate.admission.core import Ticket
from kvgate.flags import Flags
from kvgate.store import Store, open_store
from kvgate.types import AdmissionKind, AdmissionRequest, AdmissionResult

TOTAL = 6000
CAPS = {"a": 2500, "b": 3000, "c": 2000}
REQUESTS = 200


def config(overcommit: float) -> AdmissionConfig:
    return AdmissionConfig(
        total_quota=TOTAL,
        overcommit=overcommit,
        tenants=[
            {"name": "a", "guaranteed": 1000, "hard_cap": CAPS["a"], "weight": 1},
            {"name": "b", "guaranteed": 1000, "hard_cap": CAPS["b"], "weight": 2},
            {"name": "c", "hard_cap": CAPS["c"], "weight": 1},
        ],
        queue={"default_deadline_s": 60, "max_queue_tokens": 10**6},
        degrade={"modes": {"batch": "economy_pool", "bulk": "async"}},
        output={"default_max_tokens": 700},
        lease_ttl_s=5.0,
    )


class Watcher:
    """Reads the store's usage continuously; remembers every violation and the peaks."""

    def __init__(self, store: Store, limit_total: int) -> None:
        self.store = store
        self.limit_total = limit_total
        self.reads = 0
        self.violations: list[dict[str, int]] = []
        self.peak_total = 0
        self.peak: dict[str, int] = {}

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            usage = await self.store.usage()
            self.reads += 1
            total = sum(usage.values())
            self.peak_total = max(self.peak_total, total)
            for tenant, used in usage.items():
                self.peak[tenant] = max(self.peak.get(tenant, 0), used)
            if total > self.limit_total or any(usage[t] > CAPS[t] for t in usage):
                self.violations.append(dict(usage))
            await asyncio.sleep(0)


async def one_request(
    c: AdmissionController, i: int, rng: random.Random, seen: dict[str, Any]
) -> AdmissionResult:
    tenant = rng.choice("abc")
    priority_class = rng.choices(["interactive", "batch", "bulk"], [0.6, 0.25, 0.15])[0]
    max_tokens = None if rng.random() < 0.1 else rng.randint(1, 1500)
    prompt = rng.randint(20, 400)
    req = AdmissionRequest(f"inv-{i}", tenant, priority_class, prompt, max_tokens)
    result = await c.admit(req)
    if result.degrade_to == "async":
        seen["async"] += 1
        result = await c.until_admitted(result)
    if result.kind is AdmissionKind.REJECT:
        seen["rejected"] += 1
        return result
    assert isinstance(result.ticket, Ticket)
    bound = max_tokens if max_tokens is not None else 700
    assert result.reserved_tokens == prompt + bound  # the full output bound, always
    assert req.request_id in c.core.ledger  # degraded and async work is in the ledger too
    if result.kind is AdmissionKind.DEGRADE:
        seen["degraded"] += 1
    try:
        generated = 0
        while generated < bound:
            generated = min(bound, generated + rng.randint(50, 400))
            await c.progress(result, generated)
            await asyncio.sleep(rng.uniform(0.0, 0.01))
    finally:
        await c.release(result)
    return result


@pytest.mark.parametrize(
    ("backend", "overcommit"), [("memory", 1.0), ("memory", 1.5), ("redis", 1.0), ("redis", 1.5)]
)
async def test_caps_and_total_hold_at_every_moment(
    backend: str, overcommit: float, request: pytest.FixtureRequest
) -> None:
    if backend == "redis":
        url = request.getfixturevalue("fresh_redis_server").url
        stores = [open_store(url), open_store(url)]
        probe = open_store(url)
    else:
        shared = open_store("memory://")
        stores = [shared, shared]
        probe = shared
    controllers = [
        AdmissionController(
            config(overcommit),
            store,
            flags=Flags(),
            registry=CollectorRegistry(),
            gateway_id=f"gw-{i}",
        )
        for i, store in enumerate(stores)
    ]
    for c in controllers:
        await c.start()
    watcher = Watcher(probe, int(TOTAL * overcommit))
    stop = asyncio.Event()
    watch = asyncio.create_task(watcher.run(stop))
    rng = random.Random(7)
    seen = {"async": 0, "degraded": 0, "rejected": 0}
    try:
        results = await asyncio.wait_for(
            asyncio.gather(
                *(one_request(controllers[i % 2], i, rng, seen) for i in range(REQUESTS))
            ),
            timeout=120,
        )
    finally:
        stop.set()
        await watch
        for c in controllers:
            await c.stop()
        for store in {id(s): s for s in [*stores, probe]}.values():
            await store.close()
    assert watcher.violations == [], watcher.violations[:3]
    assert watcher.reads >= 100  # the watcher really watched during the run
    admitted = [r for r in results if r.kind is not AdmissionKind.REJECT]
    assert len(admitted) == REQUESTS - seen["rejected"] and len(admitted) >= REQUESTS * 0.9
    assert seen["async"] > 0 and seen["degraded"] >= 0
    # the load was heavy enough that the limits mattered
    assert watcher.peak_total > TOTAL * 0.8
    assert max(watcher.peak.values()) > min(CAPS.values()) * 0.8
