"""The default admission never hurts below saturation, against real llama.cpp servers:
the same open-loop stream through ``kvgate serve`` with its defaults and, at the same
time, through one with ``--flag admission=off``, one one-thread server each, for 60 s
at 0.6 requests/s: well below what a server sustains (a 200-token shared system prompt,
a 20-token question and 8 output tokens take ~0.4 s of one of its 2 slots) even while
the suite's other worker shares the 2 cores. (Two servers a row at 1 request/s each
overloaded the machine under the suite: p99 ≈ 5 s with admission off.)

A p99 over ~36 requests on two shared cores moves by tens of milliseconds between
identical runs, so the bound is 1.1× admission-off's p99 plus 100 ms; a gate that holds
work back costs whole requests' worth of seconds and still fails it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from kvgate.loadgen.runner import run_bench
from kvgate.procs import GatewayProcess, wait_until_routable
from kvgate.procs.llama import LlamaServer
from kvgate.report.records import RequestRecord
from kvgate.workloads import generate_workload
from kvgate.workloads.base import WorkItem
from tests.admission.test_never_hurts_e2e import metric_sum, p99

pytestmark = [pytest.mark.real_engine, pytest.mark.alone]

DURATION_S = 60.0
RATE = 0.6
NOISE_S = 0.1


def workload_items() -> list[WorkItem]:
    return generate_workload(
        "shared-prefix",
        seed=3,
        requests=int(RATE * DURATION_S),
        rate=RATE,
        groups=2,
        prompts_per_group=100,
        system_len=200,
        question_len=20,
        output_len=8,
    ).items


async def both_rows(urls: list[str]) -> list[list[RequestRecord]]:
    """The same stream through each gateway at once: whatever else the machine runs
    slows both rows alike."""
    runs = [
        run_bench(
            url,
            workload_items(),
            duration_s=DURATION_S,
            request_timeout_s=60.0,
            drain_timeout_s=60.0,
        )
        for url in urls
    ]
    return [result.records for result in await asyncio.gather(*runs)]


@pytest.mark.timeout(420)
def test_default_admission_in_front_of_llama_cpp_costs_nothing(
    llama_servers: Callable[..., list[LlamaServer]],
    gateway_factory: Callable[..., GatewayProcess],
) -> None:
    gateways = []
    for extra in ([], ["--flag", "admission=off"]):
        servers = llama_servers(1)
        gateways.append(
            gateway_factory(
                backends=[s.url for s in servers],
                extra_args=["--engine-type", "llamacpp", "--scrape-interval", "1", *extra],
            )
        )
    for gw in gateways:
        wait_until_routable(gw)
    time.sleep(1.5)  # a scrape round: fresh reports of every server
    on, off = asyncio.run(both_rows([gw.url for gw in gateways]))
    held = metric_sum(gateways[0].url, "kvgate_admission_held_with_headroom_total")
    assert len(on) == len(off) >= 0.9 * RATE * DURATION_S
    refused = [(r.http_status, r.admission) for r in on if r.http_status != 200]
    assert not refused, refused[:5]
    ttft_on = p99([r.ttft for r in on if r.ttft is not None])
    ttft_off = p99([r.ttft for r in off if r.ttft is not None])
    assert ttft_on <= 1.1 * ttft_off + NOISE_S, (ttft_on, ttft_off)
    assert held == 0
