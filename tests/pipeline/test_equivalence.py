"""Sim-vs-live equivalence: one pipeline, two drivers, the same decisions.

The same seeded workload goes through the cluster simulator (``ClusterSim``, what
``kvgate sim`` runs) and through a live gateway in front of real ``kvgate engine-sim``
processes. Requests are sequential (each ends before the next starts), so nothing that
depends on timing (in-flight load, report timing) can differ; the per-request routing
reason, expected cached tokens and admission decision must then be identical, and so
must the node where the policy is deterministic (consistent hashing). Tenant caps make
some requests too large to admit, so the admission sequence mixes admit and reject.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import aiohttp
import pytest

from kvgate.admission.config import AdmissionConfig
from kvgate.procs.ports import free_port
from kvgate.sim.cluster import ClusterSim, SimConfig
from kvgate.sim.events import ClusterEvent
from kvgate.workloads import Workload, generate_workload
from kvgate.workloads.base import PromptCache
from tests.fixtures.engines import start_engine_process
from tests.fixtures.gateway import running_gateway

MODEL = "sim"
PROFILE = "gemma3-270m-cpu"
NODES = 4
SPACING_S = 5.0  # virtual seconds between sim arrivals: each request ends before the next
FLAGS = {"cold_boost": False, "dynamic_quota": False}  # both depend on wall-clock age
KEYS = {"big": "key-big", "small": "key-small"}

Decision = tuple[str | None, str | None, int, str, str]  # node, reason, expected, kind, why


def _workload() -> Workload:
    workload = generate_workload(
        "shared-prefix",
        seed=11,
        requests=24,
        groups=4,
        system_len=600,
        question_len=40,
        output_len=6,
    )
    items = []
    for i, item in enumerate(workload.items):
        tenant = "small" if i % 3 == 0 else "big"
        max_tokens = 3 + (i * 7) % 9  # varied sizes, so a tenant cap splits them
        items.append(
            dataclasses.replace(
                item, arrival=1.0 + i * SPACING_S, tenant=tenant, max_tokens=max_tokens
            )
        )
    return dataclasses.replace(workload, items=items)


def _admission(workload: Workload) -> dict[str, Any]:
    # "small" may hold about one typical request: the longer half of its requests is
    # rejected as too large, deterministically, whatever ran before
    cache = PromptCache()
    sizes = sorted(
        cache.prompt(it).prompt_tokens + it.max_tokens
        for it in workload.items
        if it.tenant == "small"
    )
    return {
        "total_quota": 1_000_000,
        "tenants": [
            {"name": "big", "api_keys": [KEYS["big"]], "guaranteed": 100_000},
            {"name": "small", "api_keys": [KEYS["small"]], "hard_cap": sizes[len(sizes) // 2]},
        ],
    }


def _parse_admission(header: str | None) -> tuple[str, str]:
    """``admit; reason=elastic; queued_ms=0`` -> ("admit", "elastic")."""
    if not header:
        return "", ""
    parts = [p.strip() for p in header.split(";")]
    fields = dict(p.partition("=")[::2] for p in parts[1:])
    return parts[0], fields.get("reason", "")


def _routing(policy: str) -> dict[str, Any]:
    return {"policy": policy, "freshness_s": 3600.0, "scrape_interval_s": 5.0}


def run_sim(workload: Workload, policy: str, dead: str | None = None) -> list[Decision]:
    config = SimConfig(
        events=[ClusterEvent(0.0, "fail", dead)] if dead else [],
        nodes=NODES,
        profile=PROFILE,
        admission=True,
        admission_config=AdmissionConfig.model_validate(_admission(workload)),
        flags=FLAGS,
        routing={"freshness_s": 3600.0},
        model=MODEL,
        scrape_interval_s=5.0,
    )
    result = ClusterSim(workload, config, policy).run()
    by_id = {r.request_id: r for r in result.records}
    out = []
    for item in workload.items:
        rec = by_id[item.request_id]
        kind, why = _parse_admission(rec.admission)
        out.append((rec.node, rec.route_reason, rec.expected_cached_tokens, kind, why))
    return out


async def run_live(
    workload: Workload, policy: str, urls: list[str], dead: str | None = None
) -> list[Decision]:
    if dead is not None:  # a dead engine: nothing listens on its port any more
        urls = [_closed_port_url() if f"node-{i}" == dead else u for i, u in enumerate(urls)]
    config = {
        "nodes": [{"id": f"node-{i}", "url": u, "model": MODEL} for i, u in enumerate(urls)],
        # no scrapes: a report taken while a request runs would make load timing-dependent
        "scrape": {"mode": "registry"},
        "routing": _routing(policy),
        "admission": _admission(workload),
        "flags": FLAGS,
    }
    out = []
    async with running_gateway(config) as gw, aiohttp.ClientSession() as session:
        for item in workload.items:
            headers = {"Authorization": f"Bearer {KEYS[item.tenant]}"}
            async with session.post(
                gw.url + "/v1/chat/completions", json=item.chat_body(), headers=headers
            ) as resp:
                await resp.read()
                assert resp.status in (200, 413), (resp.status, await resp.text())
                kind, why = _parse_admission(resp.headers.get("X-KVGate-Admission"))
                assert resp.headers["X-Request-Id"]
                out.append(
                    (
                        resp.headers.get("X-KVGate-Node"),
                        resp.headers.get("X-KVGate-Route-Reason"),
                        int(resp.headers.get("X-KVGate-Expected-Cached-Tokens") or 0),
                        kind,
                        why,
                    )
                )
    return out


def _closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture(scope="module")
def engine_urls() -> Any:
    proc = start_engine_process(count=NODES, profile=PROFILE, model=MODEL, time_scale=50.0)
    try:
        yield proc.urls
    finally:
        proc.stop()


@pytest.mark.parametrize(
    ("policy", "dead"), [("consistent_hash", None), ("hybrid", None), ("consistent_hash", "node-3")]
)
async def test_sim_and_live_make_the_same_decisions(
    policy: str, dead: str | None, engine_urls: list[str]
) -> None:
    workload = _workload()
    sim = run_sim(workload, policy, dead)
    live = await run_live(workload, policy, engine_urls, dead)
    if dead is not None:  # the retry and ejection path: the dead node answers nothing
        assert dead not in {d[0] for d in sim}
    # the workload exercises both admission outcomes and both cache outcomes
    kinds = {d[3:] for d in sim}
    assert {("admit", "within_guarantee"), ("admit", "elastic"), ("reject", "too_large")} == kinds
    if policy == "hybrid":
        assert {"prefix_match", "home_set"} <= {d[1] for d in sim}
    # reason, expected cached tokens and admission decision, request by request
    assert [d[1:] for d in live] == [d[1:] for d in sim]
    if policy == "consistent_hash":  # deterministic placement: the same nodes too
        assert [d[0] for d in live] == [d[0] for d in sim]
    # (hybrid breaks score ties at random, so its nodes may differ; its reasons may not)
