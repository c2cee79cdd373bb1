"""Per-decision records of one policy on one simulated workload: why does it route so?

Wraps the simulator's router so every decision is kept with its reason, candidates,
the node loads and the expected cached tokens, then joins the engine's actual cached
tokens from the request records. Prints, per reason: decisions, share of prompt tokens,
expected vs actual cached tokens, and how often the chosen node was not the node with
the most expected cache (an affinity spill).

    .venv/bin/python bench/routing_diagnose.py --workload shared-prefix --policy hybrid \
        --requests 400 [--load high] [--seed 0]
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from kvgate.sim.cluster import ClusterSim, SimConfig
from kvgate.types import NoNodeAvailable, RouteDecision, RouteRequest
from kvgate.workloads import WORKLOAD_NAMES
from kvgate.workloads.catalog import generate_at_load


@dataclass(slots=True)
class DecisionRecord:
    request_id: str
    time: float
    reason: str
    node: str
    candidates: tuple[str, ...]
    loads: dict[str, float]
    best_match_node: str | None
    best_match_tokens: int
    expected_cached: int
    prompt_tokens: int
    actual_cached: int = 0


def record_decisions(sim: ClusterSim) -> list[DecisionRecord]:
    """Wrap ``sim.router.route`` so each decision is kept (the simulator is unchanged)."""
    out: list[DecisionRecord] = []
    router = sim.router
    inner = router.route

    def route(req: RouteRequest, *, exclude: Any = ()) -> RouteDecision:
        try:
            decision = inner(req, exclude=exclude)
        except NoNodeAvailable:
            raise
        now = router.clock.now()
        loads = {e.node_id: e.load for e in router.nodes.entries()}
        matches = router.cache_signal.match(req.block_hashes, now, list(loads))
        best = max(matches, key=lambda n: matches[n]) if matches else None
        out.append(
            DecisionRecord(
                req.request_id,
                now,
                decision.reason,
                decision.node_id,
                decision.candidates,
                loads,
                best,
                matches.get(best, 0) * 16 if best else 0,
                decision.expected_cached_tokens,
                req.prompt_tokens,
            )
        )
        return decision

    router.route = route  # type: ignore[method-assign]
    return out


def diagnose(workload: str, policy: str, requests: int | None, seed: int, load: str) -> str:
    wl = generate_at_load(workload, load, seed=seed, requests=requests)
    sim = ClusterSim(wl, SimConfig(nodes=8, seed=seed), policy)
    decisions = record_decisions(sim)
    result = sim.run()
    actual = {r.request_id: r.cached_tokens for r in result.records}
    for d in decisions:
        d.actual_cached = actual.get(d.request_id, 0)
    by_reason: dict[str, list[DecisionRecord]] = defaultdict(list)
    for d in decisions:
        by_reason[d.reason].append(d)
    total_prompt = sum(d.prompt_tokens for d in decisions) or 1
    lines = [
        f"{workload} ({load}) {policy} seed {seed}: {len(decisions)} decisions, "
        f"hit {result.summary['cache_hit_rate']:.1%}, "
        f"TTFT p50/p90 {result.summary['ttft_p50_s']:.3f}/{result.summary['ttft_p90_s']:.3f} s",
        "| reason | decisions | prompt share | expected cached | actual cached "
        "| away from best match | best-match tokens left behind |",
        "|---|---|---|---|---|---|---|",
    ]
    for reason, ds in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
        prompt = sum(d.prompt_tokens for d in ds) or 1
        away = [d for d in ds if d.best_match_node and d.node != d.best_match_node]
        left = sum(d.best_match_tokens - d.actual_cached for d in away)
        lines.append(
            f"| {reason} | {len(ds)} | {prompt / total_prompt:.1%} "
            f"| {sum(d.expected_cached for d in ds) / prompt:.1%} "
            f"| {sum(d.actual_cached for d in ds) / prompt:.1%} "
            f"| {len(away)} | {left / total_prompt:.1%} of prompt tokens |"
        )
    per_node = Counter(d.node for d in decisions)
    lines.append(f"requests per node: {dict(sorted(per_node.items()))}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="shared-prefix", choices=WORKLOAD_NAMES)
    parser.add_argument("--policy", default="hybrid")
    parser.add_argument("--requests", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--load", choices=("normal", "high"), default="normal")
    args = parser.parse_args()
    print(diagnose(args.workload, args.policy, args.requests, args.seed, args.load))


if __name__ == "__main__":
    main()
