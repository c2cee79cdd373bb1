"""The demo's workload and figures, without servers."""

from __future__ import annotations

from kvgate.demo.load import RequestRecord
from kvgate.demo.results import percentile, ratio, summarise
from kvgate.demo.workload import WORKLOADS, generate
from kvgate.prompts import stable_prefix


def test_workload_is_reproducible_and_shares_prefixes() -> None:
    spec = WORKLOADS["shared-prefix"]
    first = generate(spec, 10.0, "m", seed=3)
    assert first == generate(spec, 10.0, "m", seed=3)
    assert first != generate(spec, 10.0, "m", seed=4)
    assert all(0 <= r.at_s < 10.0 for r in first)
    assert [r.at_s for r in first] == sorted(r.at_s for r in first)
    assert {r.tenant for r in first} == {"interactive", "batch"}
    prefixes = {stable_prefix(r.body["messages"]) for r in first}
    assert 1 < len(prefixes) <= spec.apps  # a few shared system prompts, not one per request


def test_summary_counts_hits_rejections_and_percentiles() -> None:
    records = [
        RequestRecord("interactive", 200, ttft_s=0.1, prompt_tokens=100, cached_tokens=80,
                      completion_tokens=10, node="a"),
        RequestRecord("interactive", 200, ttft_s=0.3, prompt_tokens=100, cached_tokens=0,
                      completion_tokens=10, node="b"),
        RequestRecord("batch", 429, error="quota"),
        RequestRecord("batch", 502, error="bad gateway"),
    ]  # fmt: skip
    result = summarise("hybrid", True, records, wall_s=2.0)
    assert (result.requests, result.ok, result.rejected, result.errors) == (4, 2, 1, 1)
    assert result.token_hit_rate == 0.4
    assert result.throughput_tok_s == 10.0
    assert result.ttft_p50_ms == 200.0
    assert result.per_node == {"a": 1, "b": 1}
    assert percentile([1, 2, 3, 4], 0.5) == 2.5
    assert percentile([], 0.5) is None
    assert ratio(2.0, 4.0) == 0.5 and ratio(1.0, 0) is None
