"""The default admission never hurts below saturation, against real llama.cpp servers:
``kvgate serve`` with its defaults against one with ``--flag admission=off``, each in
front of its own one-thread server, the same open-loop stream at 0.5 requests/s: about
half of what a server sustains (a 200-token system prompt cached in the slot, a 20-token
question and 8 output tokens take ~0.35 s of its one thread; a cold slot ~0.9 s).

The rows take turns, never run at once: two CPU-bound servers plus two gateways and the
client on two cores starve each other (p99 ≈ 2–5 s with admission off, 25% apart between
identical runs). The order is off, on, on, off in 40 s segments, a segment's stream
repeated in its pair, so a slow drift of the machine weighs on both rows alike.

A p99 over 40 requests moves by tens of milliseconds between identical runs, so the bound
is 1.1× admission-off's p99 plus 100 ms; a gate that holds work back costs whole
requests' worth of seconds and still fails it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace

import pytest

from kvgate.loadgen.runner import run_bench
from kvgate.procs import GatewayProcess, wait_until_routable
from kvgate.procs.llama import LlamaServer
from kvgate.report.records import RequestRecord
from kvgate.workloads import generate_workload
from kvgate.workloads.base import WorkItem
from tests.admission.test_never_hurts_e2e import metric_sum, p99

pytestmark = [pytest.mark.real_engine, pytest.mark.alone]

SEGMENT_S = 40.0
RATE = 0.5
NOISE_S = 0.1
ORDER = [("off", 3), ("on", 3), ("on", 4), ("off", 4)]


def workload_items(seed: int) -> list[WorkItem]:
    return generate_workload(
        "shared-prefix",
        seed=seed,
        requests=int(RATE * SEGMENT_S),
        rate=RATE,
        groups=1,
        prompts_per_group=100,
        system_len=200,
        question_len=20,
        output_len=8,
    ).items


def run_segment(url: str, items: list[WorkItem], duration_s: float) -> list[RequestRecord]:
    result = asyncio.run(
        run_bench(url, items, duration_s=duration_s, request_timeout_s=60.0, drain_timeout_s=60.0)
    )
    return result.records


def warm_up(url: str) -> None:
    """Both slots of the server behind ``url`` hold the system prompt: a cold slot's
    first request costs ~0.9 s of prefill, which would land in whichever row drew it."""
    items = [replace(item, arrival=0.0) for item in workload_items(seed=99)[:2]]
    records = run_segment(url, items, duration_s=30.0)
    assert [r.http_status for r in records] == [200, 200]


@pytest.mark.timeout(420)
def test_default_admission_in_front_of_llama_cpp_costs_nothing(
    llama_servers: Callable[..., list[LlamaServer]],
    gateway_factory: Callable[..., GatewayProcess],
) -> None:
    gateways: dict[str, GatewayProcess] = {}
    for row, extra in (("on", []), ("off", ["--flag", "admission=off"])):
        servers = llama_servers(1)
        gateways[row] = gateway_factory(
            backends=[s.url for s in servers],
            extra_args=["--engine-type", "llamacpp", "--scrape-interval", "1", *extra],
        )
    for gw in gateways.values():
        wait_until_routable(gw)
    for gw in gateways.values():
        warm_up(gw.url)
    time.sleep(1.5)  # a scrape round: fresh reports of every server
    records: dict[str, list[RequestRecord]] = {"on": [], "off": []}
    for row, seed in ORDER:
        records[row] += run_segment(gateways[row].url, workload_items(seed), SEGMENT_S)
    on, off = records["on"], records["off"]
    held = metric_sum(gateways["on"].url, "kvgate_admission_held_with_headroom_total")
    sent = sum(1 for _, seed in ORDER for item in workload_items(seed) if item.arrival < SEGMENT_S)
    assert len(on) + len(off) == sent >= 0.6 * RATE * SEGMENT_S * len(ORDER)
    refused = [(r.http_status, r.admission) for r in on if r.http_status != 200]
    assert not refused, refused[:5]
    ttft_on = p99([r.ttft for r in on if r.ttft is not None])
    ttft_off = p99([r.ttft for r in off if r.ttft is not None])
    print(f"TTFT p99 admission on {ttft_on:.3f} s, off {ttft_off:.3f} s")
    assert ttft_on <= 1.1 * ttft_off + NOISE_S, (ttft_on, ttft_off)
    assert held == 0
