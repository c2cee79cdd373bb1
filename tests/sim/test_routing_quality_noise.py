"""bench/routing_quality.py's noise intervals and seed means (the matrix itself is a bench)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from kvgate.report.records import RequestRecord


def _bench() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "bench" / "routing_quality.py"
    spec = importlib.util.spec_from_file_location("routing_quality_bench", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _records(ttfts: list[float], nodes: list[str], cached: int) -> list[RequestRecord]:
    return [
        RequestRecord(
            request_id=f"r{i}",
            tenant="t",
            node=n,
            arrival=float(i),
            status="ok",
            ttft=t,
            prompt_tokens=100,
            cached_tokens=cached,
        )
        for i, (t, n) in enumerate(zip(ttfts, nodes, strict=True))
    ]


def test_paired_intervals_see_a_uniform_shift_and_nothing_between_equals() -> None:
    rq = _bench()
    ttfts = [0.01 * (1 + i % 17) for i in range(200)]
    nodes = [f"n{i % 4}" for i in range(200)]
    same = _records(ttfts, nodes, 50)
    slower = _records([t + 0.005 for t in ttfts], nodes, 40)
    noise = rq.paired_noise(
        {"hybrid": slower, "smg-approx": same, "oracle": same}, ["n0", "n1", "n2", "n3"], 0
    )
    # every request is 5 ms slower and 10 points less cached: paired resamples see
    # exactly that, whatever requests they draw
    lo, hi = noise["hybrid-smg"]["p90"]
    assert abs(lo - 0.005) < 1e-9 and abs(hi - 0.005) < 1e-9
    lo, hi = noise["hybrid-smg"]["hit"]
    assert abs(lo + 0.1) < 1e-9 and abs(hi + 0.1) < 1e-9
    assert noise["hybrid-smg"]["cv"] == [0.0, 0.0]  # same nodes
    # the oracle equals the best other policy on every resample
    assert noise["oracle/best-1"]["p90"] == [0.0, 0.0]


def test_checks_on_seed_means_and_a_miss_names_its_interval() -> None:
    rq = _bench()

    def cell(seed: int, h_hit: float) -> dict[str, object]:
        res = {key: 1.0 for _, key, _ in rq.METRICS}
        res.update(cache_hit_rate=0.5, node_load_cv=0.1)
        return {
            "workload": "tool-agent",
            "load": "normal",
            "seed": seed,
            "results": {
                "hybrid": {**res, "cache_hit_rate": h_hit},
                "smg-approx": res,
                "round_robin": {**res, "ttft_p90_s": 2.0},
            },
            "noise": {"hybrid-smg": {"hit": [-0.02, 0.01]}},
        }

    cells = [cell(0, 0.49), cell(1, 0.52)]
    missed = rq.checks(cells[0])
    assert missed == [
        "tool-agent normal seed 0: hybrid hit 49.00% < smg 50.00%; "
        "resampled 95%: [-2.000 pt, +1.000 pt]"
    ]
    mean = rq.seed_mean(cells, "tool-agent", "normal")
    assert mean["results"]["hybrid"]["cache_hit_rate"] == 0.505
    assert rq.checks(mean) == []
