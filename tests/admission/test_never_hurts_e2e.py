"""The default admission in front of engines at realistic speed never hurts below
saturation: real ``kvgate engine-sim`` processes at ``--time-scale 1`` with a 20 ms per
token decode and a slow prefill, ``kvgate serve`` with its defaults (admission, prefill
gate, dynamic quota on) against the same gateway with ``--flag admission=off``, the same
open-loop stream at half the engines' saturation for 60 s each.

Saturation here is the engines' prefill rate: 2 engines × 1,000 prompt tokens/s over
~110 uncached tokens per request (a 1,000-token system prompt is cached after its first
request) ≈ 18 requests/s; the stream offers 9 requests/s.
"""

from __future__ import annotations

import asyncio
import re
import urllib.request

import pytest

from kvgate.loadgen.runner import run_bench
from kvgate.procs import GatewayProcess, start_engine_process, start_gateway_process
from kvgate.report.records import RequestRecord
from kvgate.workloads import generate_workload

pytestmark = pytest.mark.alone

DURATION_S = 60.0
RATE = 9.0
ENGINE_ARGS = ["--decode-ms-per-token", "20", "--prefill-tokens-per-s", "2000"]


def p99(values: list[float]) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(0.99 * len(values)))]


def metric_sum(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    pattern = re.compile(rf"^{name}(?:\{{[^}}]*\}})? ([0-9.e+-]+)$", re.M)
    return sum(float(v) for v in pattern.findall(text))


def run_row(extra_args: list[str]) -> tuple[list[RequestRecord], float]:
    engines = start_engine_process(
        count=2, profile="llama3-8b-h100", time_scale=1.0, model="sim", extra_args=ENGINE_ARGS
    )
    gateway: GatewayProcess | None = None
    try:
        gateway = start_gateway_process(backends=engines.urls, extra_args=extra_args)
        workload = generate_workload(
            "shared-prefix",
            seed=7,
            requests=int(RATE * DURATION_S),
            rate=RATE,
            groups=4,
            prompts_per_group=400,
            system_len=500,
            question_len=200,
            output_len=32,
        )
        result = asyncio.run(
            run_bench(
                gateway.url,
                workload.items,
                duration_s=DURATION_S,
                model="sim",
                request_timeout_s=60.0,
                drain_timeout_s=60.0,
            )
        )
        held = metric_sum(gateway.url, "kvgate_admission_held_with_headroom_total")
        return result.records, held
    finally:
        if gateway is not None:
            gateway.stop()
        engines.stop()


@pytest.mark.timeout(420)
def test_default_admission_at_half_saturation_costs_nothing() -> None:
    on, held = run_row([])
    off, _ = run_row(["--flag", "admission=off"])
    for records in (on, off):
        assert len(records) >= 0.95 * RATE * DURATION_S
    statuses = {r.http_status for r in on}
    assert statuses == {200}, [(r.http_status, r.admission) for r in on if r.http_status != 200][:5]
    assert all(r.ttft is not None for r in on + off)
    ttft_on = p99([r.ttft for r in on if r.ttft is not None])
    ttft_off = p99([r.ttft for r in off if r.ttft is not None])
    assert ttft_on <= 1.1 * ttft_off, (ttft_on, ttft_off)
    assert held == 0
