"""How long the cluster simulator takes for a large cluster (goal: 1M requests on 256 nodes
in <= 10 min on one core).

Runs the `shared-prefix` workload (4,096 prefix groups so 256 nodes all get work) through
`hybrid` and `round_robin` on N nodes and reports CPU time in two parts:

- set-up, paid once whatever the request count: building the cluster and tokenizing each
  prefix group's 2,048-token system prompt (``ClusterSim.warm_prompts``; the number of
  groups does not grow with ``--requests``, and the run would otherwise do it on each
  group's first arrival);
- the run, per simulated request.

The projection to 1M requests is set-up + 1M × per request; ``projected_1m_linear_min``
also charges the set-up per request (the figure before the split, pessimistic for 1M).
`--requests 1000000` runs the full size. The machine's other load inflates CPU time too:
compare against a baseline measured in the same session.

    .venv/bin/python bench/sim_scale.py --nodes 256 --requests 50000
"""

from __future__ import annotations

import argparse
import json
import time

from kvgate.sim.cluster import ClusterSim, SimConfig
from kvgate.workloads import generate_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=256)
    ap.add_argument("--requests", type=int, default=50_000)
    ap.add_argument("--rate", type=float, default=None, help="default: 2 req/s per node")
    ap.add_argument("--policies", default="hybrid,round_robin")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rate = args.rate or 2.0 * args.nodes
    groups = max(64, 16 * args.nodes)
    t0 = time.perf_counter()
    workload = generate_workload(
        "shared-prefix",
        seed=args.seed,
        requests=args.requests,
        rate=rate,
        groups=groups,
        prompts_per_group=max(16, args.requests // groups + 1),
    )
    gen_s = time.perf_counter() - t0
    rows = []
    for policy in args.policies.split(","):
        t1 = time.process_time()
        sim = ClusterSim(workload, SimConfig(nodes=args.nodes, seed=args.seed), policy)
        groups_seen = sim.warm_prompts()
        setup = time.process_time() - t1
        t2 = time.process_time()
        result = sim.run()
        run_cpu = time.process_time() - t2
        per_req = run_cpu / args.requests
        rows.append(
            {
                "policy": policy,
                "nodes": args.nodes,
                "requests": args.requests,
                "virtual_s": round(result.virtual_s, 1),
                "cpu_s": round(setup + run_cpu, 1),
                "setup_cpu_s": round(setup, 2),
                "prefix_groups_warmed": groups_seen,
                "run_cpu_s": round(run_cpu, 1),
                "cpu_us_per_request": round(per_req * 1e6),
                "projected_1m_requests_min": round((setup + per_req * 1_000_000) / 60, 1),
                "projected_1m_linear_min": round(
                    (setup + run_cpu) / args.requests * 1_000_000 / 60, 1
                ),
                "lost": result.summary["lost"],
                "cache_hit_rate": round(result.summary["cache_hit_rate"] or 0.0, 3),
            }
        )
    print(json.dumps({"workload_generation_s": round(gen_s, 1), "runs": rows}, indent=2))


if __name__ == "__main__":
    main()
