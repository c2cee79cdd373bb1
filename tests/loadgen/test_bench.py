"""`kvgate bench` against real engine-sim + `kvgate serve` subprocesses (no mocks)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kvgate.loadgen import run_bench
from kvgate.report.summary import summarize
from kvgate.workloads import Workload, generate_workload
from tests.fixtures.engines import start_engine_process
from tests.fixtures.gateway import GatewayProcess, start_gateway_process

TIME_SCALE = 50.0
SMALL = {"groups": 2, "system_len": 256, "question_len": 32, "output_len": 16}


def small_workload(requests: int, **params: Any) -> Workload:
    return generate_workload("shared-prefix", seed=1, requests=requests, **{**SMALL, **params})


@contextmanager
def cluster(
    nodes: int = 2, policy: str = "hybrid", config: dict[str, Any] | None = None
) -> Iterator[GatewayProcess]:
    """Fresh engines (empty caches) and a gateway in front of them; all stopped after."""
    engines = start_engine_process(count=nodes, time_scale=TIME_SCALE)
    gw: GatewayProcess | None = None
    try:
        gw = start_gateway_process(
            backends=engines.urls, config=config, extra_args=["--policy", policy]
        )
        yield gw
    finally:
        if gw is not None:
            gw.stop()
        engines.stop()


async def test_runner_issues_n_requests_and_records_each() -> None:
    workload = small_workload(12, rate=0.5)
    with cluster() as gw:
        result = await run_bench(gw.url, workload.items, arrival_scale=1.0 / TIME_SCALE)
    recs = result.records
    assert result.issued == 12 and len(recs) == 12
    assert sorted(r.request_id for r in recs) == sorted(i.request_id for i in workload.items)
    assert all(r.status == "ok" and r.http_status == 200 for r in recs), result.errors
    assert all(r.ttft is not None and r.ttft > 0 for r in recs)
    assert all(r.e2e is not None and r.e2e >= (r.ttft or 0) for r in recs)
    assert all(r.tpot is not None and r.output_tokens == 16 for r in recs)
    assert all(r.node in ("node-0", "node-1") for r in recs)
    assert all(r.prompt_tokens > 256 for r in recs)
    # two groups sharing a 256-token system prompt: later requests hit the cache
    assert sum(r.cached_tokens for r in recs) >= 8 * 256
    assert sum(r.expected_cached_tokens for r in recs) > 0
    assert summarize(recs, duration_s=result.duration_s, issued=result.issued)["lost"] == 0


async def test_over_quota_requests_are_recorded_as_rejected() -> None:
    config = {"admission": {"total_quota": 600, "queue": {"max_queue_tokens": 0}}}
    workload = small_workload(16, output_len=64)
    with cluster(nodes=1, config=config) as gw:
        result = await run_bench(gw.url, workload.items, concurrency=4)
    statuses = [r.status for r in result.records]
    assert len(result.records) == result.issued == 16
    assert "rejected" in statuses and "ok" in statuses
    assert set(statuses) <= {"ok", "rejected"}, result.errors
    rejected = [r for r in result.records if r.status == "rejected"]
    assert all(r.http_status == 429 and r.ttft is None for r in rejected)
    assert all(r.admission == "reject" for r in rejected)


async def test_duration_bounds_what_is_issued_and_nothing_is_dropped() -> None:
    workload = small_workload(16, rate=8.0)  # arrivals over ~2 s of wall time
    with cluster(nodes=1) as gw:
        result = await run_bench(gw.url, workload.items, duration_s=0.6)
    assert 0 < result.issued < 16
    assert len(result.records) == result.issued
    assert all(r.arrival <= 0.7 and r.status == "ok" for r in result.records), result.errors


async def test_unreachable_target_yields_error_records_not_drops() -> None:
    workload = small_workload(3)
    result = await run_bench(
        "http://127.0.0.1:9", workload.items, arrival_scale=0.0, model="m", request_timeout_s=5
    )
    assert len(result.records) == 3
    assert all(r.status == "error" and r.http_status == 0 for r in result.records)
    assert sum(result.errors.values()) == 3


def test_cli_writes_its_report_files(tmp_path: Path) -> None:
    out = tmp_path / "report"
    with cluster() as gw:
        proc = subprocess.run(
            [
                sys.executable, "-m", "kvgate", "bench", "--target", gw.url,
                "--workload", "shared-prefix", "--requests", "10", "--concurrency", "3",
                "--seed", "2", "--out", str(out), "--json",
                *[f"--param={k}={v}" for k, v in SMALL.items()],
            ],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)
    assert results["live"]["requests"] == 10 and results["live"]["completed"] == 10
    assert results["live"]["mode"] == "closed"
    assert "finished issued 10/10" in proc.stderr  # plain progress lines when not a TTY
    for name in ("results.json", "results.csv", "requests.csv", "report.md", "ttft_cdf.png"):
        assert (out / name).stat().st_size > 0, name
    assert len((out / "requests.csv").read_text().strip().splitlines()) == 11
    assert "| live |" in (out / "report.md").read_text()


async def test_simulator_and_live_bench_agree_on_a_small_workload() -> None:
    """Same workload, profile, node count and policy: hit rate within 0.1, same counts.

    The workload's arrivals are in engine (virtual) seconds; the live run divides them
    by the engines' time scale so both see the same load.
    """
    from kvgate.sim import SimConfig, run_comparison

    workload = small_workload(20, rate=0.5)
    config = SimConfig(nodes=2, profile="gemma3-270m-cpu", seed=1)
    sim = run_comparison(workload, config, ["hybrid"])["hybrid"].summary
    with cluster(policy="hybrid") as gw:
        result = await run_bench(gw.url, workload.items, arrival_scale=1.0 / TIME_SCALE)
    live = summarize(result.records, duration_s=result.duration_s, issued=result.issued)
    assert live["requests"] == sim["requests"] == 20
    assert live["completed"] == sim["completed"] == 20
    assert abs(live["cache_hit_rate"] - sim["cache_hit_rate"]) <= 0.1, (live, sim)
