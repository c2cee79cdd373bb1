"""The simulator drives the real engine model, router and admission; results are deterministic."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvgate.prompts import render_chat
from kvgate.sim import cli
from kvgate.sim.cluster import ClusterSim, SimConfig, run_comparison
from kvgate.sim.events import ClusterEvent, parse_event
from kvgate.tokens import text_block_hashes
from kvgate.workloads import WORKLOAD_NAMES, PromptCache, generate_workload

ALL_POLICIES = [
    "random",
    "round_robin",
    "least_load",
    "least_request",
    "consistent_hash",
    "cache_aware",
    "hybrid",
    "smg-approx",
    "oracle",
]


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def _summaries(*argv: str) -> str:
    workload, config, policies = cli.build(_args(*argv))
    results = run_comparison(workload, config, policies)
    for r in results.values():
        r.summary.pop("sim_wall_s")
    return json.dumps(cli.results_json(results), sort_keys=True)


def test_same_seed_gives_identical_results() -> None:
    argv = ("--workload", "shared-prefix", "--nodes", "4", "--requests", "120")
    first = _summaries(*argv, "--policies", "random,hybrid")
    assert first == _summaries(*argv, "--policies", "random,hybrid")
    assert first != _summaries(*argv, "--policies", "random,hybrid", "--seed", "7")


def test_cli_output_is_identical_across_processes(tmp_path: Path) -> None:
    """String hashing is randomised per process; the simulation must not depend on it."""
    outs = []
    for i in range(2):
        out = tmp_path / f"run{i}"
        subprocess.run(
            [sys.executable, "-m", "kvgate", "sim", "--workload", "hot-prefix", "--nodes", "3",
             "--requests", "80", "--policies", "hybrid,smg-approx", "--out", str(out)],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        doc = json.loads((out / "results.json").read_text())
        for r in doc["results"].values():
            r.pop("sim_wall_s")
        outs.append(json.dumps(doc["results"], sort_keys=True))
    assert outs[0] == outs[1]


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_no_request_is_lost(policy: str) -> None:
    workload = generate_workload("multi-turn", seed=3, requests=80)
    result = ClusterSim(workload, SimConfig(nodes=3), policy).run()
    assert result.summary["requests"] == 80
    assert result.summary["lost"] == 0
    assert result.summary["completed"] == 80
    assert all(r.e2e is not None and r.e2e >= r.ttft >= 0 for r in result.records)  # type: ignore[operator]


def test_oracle_expected_cached_equals_engine_truth() -> None:
    # low rate: each request is scheduled at once, so nothing changes between the
    # oracle's look at the engine and the engine's own prefix lookup
    workload = generate_workload("shared-prefix", seed=1, requests=96, rate=2.0)
    result = ClusterSim(workload, SimConfig(nodes=4), "oracle").run()
    expected = [r.expected_cached_tokens for r in result.records]
    actual = [r.cached_tokens for r in result.records]
    assert sum(actual) > 0
    assert expected == actual


def test_hit_rate_comes_from_the_engines() -> None:
    workload = generate_workload("shared-prefix", seed=2, requests=256)
    rr = ClusterSim(workload, SimConfig(nodes=8), "round_robin").run().summary
    hy = ClusterSim(workload, SimConfig(nodes=8), "hybrid").run().summary
    assert hy["cache_hit_rate"] > rr["cache_hit_rate"] + 0.1
    # the per-request cached tokens are what the engines counted
    assert hy["engine_hit_rate"] == pytest.approx(hy["cache_hit_rate"], rel=1e-9)


def test_prompt_cache_matches_full_tokenization() -> None:
    cache = PromptCache()
    for name in WORKLOAD_NAMES:
        for item in generate_workload(name, seed=5, requests=12).items:
            p = cache.prompt(item)
            assert (p.prompt_tokens, p.block_hashes) == text_block_hashes(
                render_chat(item.messages)
            )


def test_cluster_events_lose_nothing_and_change_the_cluster() -> None:
    workload = generate_workload("hot-prefix", seed=4, requests=150)
    events = [
        ClusterEvent(2.0, "fail", "node-1"),
        ClusterEvent(3.0, "join", "node-3"),
        ClusterEvent(4.0, "flush", "node-0"),
    ]
    result = ClusterSim(workload, SimConfig(nodes=3, events=events), "hybrid").run()
    s = result.summary
    assert s["lost"] == 0
    assert s["completed"] + s["errors"] == 150
    assert s["node_requests"].get("node-3", 0) > 0  # the new node got traffic
    late = [r for r in result.records if r.arrival > 2.0]
    assert late and all(r.node != "node-1" for r in late)  # the dead node gets nothing


def test_admission_queues_and_rejects_in_virtual_time() -> None:
    workload = generate_workload("overload", seed=1, requests=300, load_multiple=4.0)
    cfg = SimConfig(nodes=2, admission=True, total_quota=20_000, kv_blocks=2000)
    s = ClusterSim(workload, cfg, "hybrid").run().summary
    assert s["lost"] == 0
    assert s["queued"] > 0
    assert s["completed"] > 0
    assert s["completed"] + s["rejected"] + s["errors"] == 300
    off = ClusterSim(workload, SimConfig(nodes=2, kv_blocks=2000), "hybrid").run().summary
    assert off["queued"] == 0 and off["rejected"] == 0


def test_cli_writes_report_files(tmp_path: Path) -> None:
    args = _args("--workload", "hot-prefix", "--nodes", "2", "--requests", "40",
                 "--policies", "round_robin,hybrid", "--out", str(tmp_path))  # fmt: skip
    assert cli.run(args) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert set(data["results"]) == {"round_robin", "hybrid"}
    for name in ("report.md", "results.csv", "requests.csv", "ttft_cdf.png", "node_load.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert "| policy" in (tmp_path / "report.md").read_text()


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="bogus"):
        generate_workload("shared-prefix", bogus=1)
    with pytest.raises(ValueError, match="KIND:TIME:NODE"):
        parse_event("explode:3:node-1")
    assert cli.run(_args("--policies", "no_such_policy", "--requests", "5")) == 2


def test_dynamic_quota_loop_runs_in_virtual_time() -> None:
    # ~120 virtual seconds: the production control loop steps every 25 s
    workload = generate_workload("overload", seed=2, requests=600, rate=2.5)
    base = {"nodes": 2, "admission": True, "total_quota": 20_000, "kv_blocks": 4000}
    on = ClusterSim(workload, SimConfig(**base), "hybrid").run().summary  # type: ignore[arg-type]
    assert on["lost"] == 0
    assert on["quota_adjustments"] >= 1
    assert on["quota_total_final"] > 20_000  # queue demand with KV to spare: it relaxed
    off_cfg = SimConfig(**base, flags={"dynamic_quota": False})  # type: ignore[arg-type]
    off = ClusterSim(workload, off_cfg, "hybrid").run().summary
    assert off["quota_adjustments"] == 0 and off["quota_total_final"] == 20_000
    assert on["completed"] >= off["completed"]


ROUTING_WORKLOADS = ("shared-prefix", "tenant-prefix", "multi-turn", "tool-agent", "hot-prefix")


@pytest.mark.parametrize("workload", ROUTING_WORKLOADS)
def test_oracle_has_the_lowest_ttft_p90(workload: str) -> None:
    """The oracle (true cache and queue) is the TTFT ceiling, within 1% noise."""
    wl = generate_workload(workload, seed=0, requests=300)
    results = run_comparison(
        wl, SimConfig(nodes=4), ["round_robin", "smg-approx", "hybrid", "oracle"]
    )
    p90 = {p: r.summary["ttft_p90_s"] for p, r in results.items()}
    assert p90["oracle"] <= min(p90.values()) * 1.01, p90


def test_high_load_variant_is_named_and_overridable() -> None:
    workload, _, _ = cli.build(_args("--workload", "tool-agent", "--load", "high"))
    assert workload.params["rate"] == 600.0 and len(workload.items) == 3000
    workload, _, _ = cli.build(
        _args("--workload", "tool-agent", "--load", "high", "--requests", "50", "--rate", "9")
    )
    assert workload.params["rate"] == 9.0 and len(workload.items) == 50
    with pytest.raises(ValueError, match="no high-load variant"):
        cli.build(_args("--workload", "overload", "--load", "high"))


def test_warm_prompts_moves_head_work_before_the_run_and_changes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import kvgate.tokens as tokens

    workload = generate_workload("shared-prefix", seed=2, requests=150, rate=40.0, groups=12)
    config = SimConfig(nodes=4, seed=2)
    plain = ClusterSim(workload, config, "hybrid").run()

    long_texts: list[int] = []
    real = tokens.tokenize

    def counting(text: str) -> list[str]:
        if len(text) > 2_000:  # a system prompt, not a question
            long_texts.append(len(text))
        return real(text)

    monkeypatch.setattr(tokens, "tokenize", counting)
    sim = ClusterSim(workload, config, "hybrid")
    assert sim.warm_prompts() == len({item.group for item in workload.items})
    warmed_heads = len(long_texts)
    assert warmed_heads == len({item.messages[0]["content"] for item in workload.items})
    warm = sim.run()
    assert len(long_texts) == warmed_heads  # the run tokenized no head again
    assert [
        (r.request_id, r.node, r.route_reason, r.cached_tokens, r.ttft) for r in warm.records
    ] == [(r.request_id, r.node, r.route_reason, r.cached_tokens, r.ttft) for r in plain.records]
    warm.summary.pop("sim_wall_s")
    plain.summary.pop("sim_wall_s")
    assert warm.summary == plain.summary
