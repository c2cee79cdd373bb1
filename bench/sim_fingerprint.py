"""Fingerprints of a fixed set of simulations, to show a speed-up changed no decision.

Runs 25 small simulations (eight workloads; policies hybrid, cache_aware, round_robin,
consistent_hash, least_load, least_request, random, precise, oracle, smg-approx;
admission on and off; node failures, joins and flushes; several flags off), the daily
forecast workload with flag ``forecast`` off and on, and ``bench/sim_scale.py``'s
256-node workload at 3,000 requests (hybrid, round_robin), and prints one SHA-256 per
run over every request's node, route reason, expected and actual cached tokens, status,
admission, TTFT and E2E, the summary (less wall time), the series and the engine
counters. Run it on two trees and diff the output:

    .venv/bin/python bench/sim_fingerprint.py > new.txt
    PYTHONPATH=<old tree>/src .venv/bin/python bench/sim_fingerprint.py > old.txt
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kvgate.sim.cluster import ClusterSim, SimConfig, SimResult
from kvgate.sim.events import ClusterEvent
from kvgate.workloads import generate_workload
from kvgate.workloads.catalog import generate_at_load

E = ClusterEvent
# (workload, load, requests, nodes, seed, policies, admission, events, flags off)
CASES: list[tuple[str, str, int, int, int, list[str], bool, list[ClusterEvent], list[str]]] = [
    ("shared-prefix", "normal", 600, 16, 0,
     ["hybrid", "round_robin", "cache_aware", "consistent_hash"], False, [], []),
    ("shared-prefix", "normal", 600, 16, 3,
     ["hybrid", "least_load", "least_request", "random"], True, [], []),
    ("multi-turn", "normal", 500, 8, 1, ["hybrid", "precise", "oracle", "smg-approx"], False,
     [E(5.0, "fail", "node-2"), E(10.0, "join", "node-8"), E(12.0, "flush", "node-3")], []),
    ("tenant-prefix", "high", 800, 8, 2, ["hybrid", "round_robin"], True, [], []),
    ("overload", "normal", 600, 8, 0, ["hybrid"], True, [], []),
    ("tool-agent", "normal", 400, 8, 5, ["hybrid"], False, [],
     ["cold_boost", "consistent_hashing"]),
    ("long-short-mix", "normal", 400, 8, 4, ["hybrid", "least_load"], True,
     [E(3.0, "fail", "node-1")], ["retry_budget"]),
    ("hot-prefix", "normal", 400, 32, 7, ["hybrid", "round_robin"], False,
     [E(2.0, "join", "node-32")], []),
    ("apps", "normal", 300, 8, 0, ["hybrid"], True, [], []),
    ("shared-prefix", "normal", 400, 16, 9, ["hybrid", "cache_aware"], False, [],
     ["load_guard", "hit_feedback"]),
    ("multi-turn", "normal", 400, 16, 8, ["hybrid", "consistent_hash"], False,
     [E(1.0, "join", "node-16")], ["cache_affinity"]),
]  # fmt: skip


def fingerprint(result: SimResult, extra: Any = None) -> str:
    summary = {k: v for k, v in result.summary.items() if k != "sim_wall_s"}
    records = [
        (r.request_id, r.node, r.route_reason, r.expected_cached_tokens, r.cached_tokens,
         r.status, r.http_status, r.admission, r.ttft, r.e2e, r.output_tokens)
        for r in result.records
    ]  # fmt: skip
    blob = [summary, records, result.node_load, result.hit_rate, result.engine_truth, extra]
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()


def main() -> None:
    for i, (name, load, n, nodes, seed, policies, admission, events, off) in enumerate(CASES):
        workload = generate_at_load(name, load, seed=seed, requests=n, rate=None)
        for policy in policies:
            config = SimConfig(
                nodes=nodes,
                seed=seed,
                admission=admission,
                events=list(events),
                flags=dict.fromkeys(off, False),
                degrade_modes={"batch": "low_priority"} if admission else {},
            )
            print(f"{i}:{name}:{policy}", fingerprint(ClusterSim(workload, config, policy).run()))
    daily = generate_workload("daily", days=2, day_s=1200.0, peak_rate=1.0, sample_s=60.0)
    for on in (False, True):
        config = SimConfig(nodes=2, kv_blocks=128, admission=True, flags={"forecast": on})
        sim = ClusterSim(daily, config, "hybrid")
        result = sim.run()
        assert sim.forecast is not None
        print(f"daily:forecast={on}", fingerprint(result, sim.forecast.score.abs_pct_errors))
    bench = generate_workload(
        "shared-prefix", seed=0, requests=3000, rate=512.0, groups=4096, prompts_per_group=16
    )
    for policy in ("hybrid", "round_robin"):
        result = ClusterSim(bench, SimConfig(nodes=256, seed=0), policy).run()
        print(f"sim_scale-256:{policy}", fingerprint(result))


if __name__ == "__main__":
    main()
