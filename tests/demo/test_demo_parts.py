"""The demo's workload, progress lines and comparison, without servers."""

from __future__ import annotations

from kvgate.demo.cli import VARIANTS, gateway_config
from kvgate.demo.live import plain_lines, with_real_address
from kvgate.demo.table import comparison_rows
from kvgate.gateway.config import parse_config
from kvgate.loadgen.runner import BenchProgress
from kvgate.prompts import stable_prefix
from kvgate.workloads import generate_workload


def test_apps_workload_is_reproducible_and_shares_prefixes() -> None:
    first = generate_workload("apps", seed=3, duration_s=10.0).items
    assert first == generate_workload("apps", seed=3, duration_s=10.0).items
    assert first != generate_workload("apps", seed=4, duration_s=10.0).items
    assert all(0 <= w.arrival < 10.0 for w in first)
    assert [w.arrival for w in first] == sorted(w.arrival for w in first)
    assert len({w.request_id for w in first}) == len(first)
    assert {(w.tenant, w.priority_class) for w in first} == {
        ("interactive", "interactive"),
        ("batch", "batch"),
    }
    prefixes = {stable_prefix(w.messages) for w in first}
    assert 1 < len(prefixes) <= 8  # a few shared system prompts, not one per request


def test_light_variant_sends_less() -> None:
    full = generate_workload("apps", seed=1, duration_s=30.0, **VARIANTS["shared-prefix"])
    light = generate_workload("apps", seed=1, duration_s=30.0, **VARIANTS["light"])
    assert len(light.items) < len(full.items)


def test_plain_progress_fits_80_columns() -> None:
    summary = {
        "admission": {"decisions_total": {"admit": {"guaranteed": 40, "elastic": 2}, "queue": 3}},
        "tenants": [{"queue_depth": 2}, {"queue_depth": 1}],
        "nodes": [
            {"node_id": f"node-{i}", "state": "healthy", "kv_usage": 0.5, "actual_hit_rate": 0.25}
            for i in range(7)
        ],
    }
    progress = BenchProgress(total=120, issued=40, done=30)
    lines = plain_lines("hybrid + admission", 12.0, 25.0, progress, summary)
    assert lines[0] == "[hybrid + admission]  12.0/25s sent 40/120 done 30"
    assert "admit 42 queue 3 reject 0 degrade 0" in lines[1] and "queued 3" in lines[1]
    assert sum(line.count("node-") for line in lines) == 7
    assert all(len(line) <= 80 for line in lines), lines


def test_summary_shows_the_port_the_gateway_listens_on() -> None:
    summary = {"gateway": {"id": "127.0.0.1:0", "policy": "hybrid"}}
    shown = with_real_address(summary, "http://127.0.0.1:41234")
    assert shown["gateway"] == {"id": "127.0.0.1:41234", "policy": "hybrid"}
    named = {"gateway": {"id": "gw-a"}}
    assert with_real_address(named, "http://127.0.0.1:41234") is named


def test_comparison_rows_give_candidate_over_baseline() -> None:
    base = {"ttft_p50_s": 0.4, "cache_hit_rate": 0.2, "rejected": 0, "completed": 10}
    cand = {"ttft_p50_s": 0.1, "cache_hit_rate": 0.5, "rejected": 2, "completed": 10}
    rows = {r["metric"]: r for r in comparison_rows("rr", base, "hy", cand)}
    assert rows["TTFT p50 (ms)"]["ratio"] == 0.25
    assert rows["token hit rate"]["ratio"] == 2.5
    assert rows["rejected (429/408/503)"]["ratio"] is None  # no ratio against zero
    assert rows["completed"]["rr"] == rows["completed"]["hy"] == 10


def test_the_demo_runs_kvgate_serves_admission_defaults() -> None:
    """Beyond its two tenants, the demo's gateway config sets no admission knob: what it
    shows is what ``kvgate serve`` does out of the box."""
    config = parse_config(gateway_config(["http://127.0.0.1:1"], "hybrid", admission=True))
    defaults = parse_config({"nodes": [{"id": "n", "url": "http://127.0.0.1:1"}]})
    shown = config.admission.model_dump(exclude={"tenants"})
    assert shown == defaults.admission.model_dump(exclude={"tenants"})
    assert [t.name for t in config.admission.tenants] == ["interactive", "batch"]
    assert config.flags == defaults.flags | {"admission": True}
