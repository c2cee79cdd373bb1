"""Adapters on real /metrics samples of each engine, and on text that changes over time."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvgate.adapters import ENGINE_TYPES, get_adapter
from kvgate.adapters.llamacpp import LlamaCppAdapter
from kvgate.adapters.prom import MetricsParseError, parse_metrics
from kvgate.types import NodeReport

SAMPLES = Path(__file__).parent / "samples"


def sample(name: str) -> str:
    return (SAMPLES / name).read_text()


def bump(text: str, metric: str, value: float) -> str:
    """Set every sample of ``metric`` (any labels) to ``value``."""
    pattern = re.compile(rf"^({re.escape(metric)}(?:\{{[^}}]*\}})?) \S+$", re.MULTILINE)
    out, n = pattern.subn(rf"\g<1> {value}", text)
    assert n, f"{metric} not in sample"
    return out


def test_every_engine_type_has_an_adapter() -> None:
    assert set(ENGINE_TYPES) == {"vllm", "sglang", "tgi", "llamacpp", "sim"}
    for name in ENGINE_TYPES:
        assert get_adapter(name).engine_type == name
    with pytest.raises(ValueError, match="engine_type"):
        get_adapter("triton")


def test_vllm_sample() -> None:
    r = get_adapter("vllm").parse(sample("vllm.txt"), node_id="v", now=100.0)
    assert not r.stale and r.engine_type == "vllm" and r.node_id == "v"
    assert (r.running, r.waiting, r.kv_usage) == (0.0, 0.0, 0.0)
    assert r.kv_capacity_tokens == 7281 * 16
    assert r.process_start_time == pytest.approx(1.7181405583e09)
    assert r.extra["prompt_tokens_total"] == 5.0
    assert r.extra["generation_tokens_total"] == 7.0
    assert r.extra["prefix_queries_total"] == 117.0
    assert r.extra["prefix_hits_total"] == 64.0
    # No previous report: the hit rate since the engine started.
    assert r.prefix_hit_rate == pytest.approx(64 / 117)
    assert not r.counters_reset


def test_vllm_0_32_cpu_sample() -> None:
    """A complete scrape of a real vLLM 0.32 (CPU) engine, one request running."""
    r = get_adapter("vllm").parse(sample("vllm_0_32.txt"), node_id="v", now=100.0)
    assert not r.stale and r.engine_type == "vllm"
    assert (r.running, r.waiting) == (1.0, 0.0)
    assert r.kv_usage == pytest.approx(0.0006103888176768324)
    # cache_config_info: kv_cache_size_tokens 524288 == num_gpu_blocks 16384 x block_size 32
    assert r.kv_capacity_tokens == 16384 * 32 == 524288
    assert r.extra["kv_block_size"] == 32.0
    assert r.process_start_time == pytest.approx(1.79641223246e09)
    assert r.extra["prompt_tokens_total"] == 1226.0
    assert r.extra["generation_tokens_total"] == 303.0
    assert r.extra["prefix_queries_total"] == 1226.0
    assert r.extra["prefix_hits_total"] == 768.0
    assert r.extra["requests_total"] == 4.0  # summed over finished_reason
    assert r.prefix_hit_rate == pytest.approx(768 / 1226)
    assert r.prefix_hit_rate is not None and 0.0 < r.prefix_hit_rate <= 1.0


def test_vllm_capacity_from_blocks_when_size_tokens_is_absent() -> None:
    text = sample("vllm_0_32.txt").replace('kv_cache_size_tokens="524288",', "")
    r = get_adapter("vllm").parse(text, node_id="v", now=1.0)
    assert r.kv_capacity_tokens == 16384 * 32
    unprofiled = text.replace('num_gpu_blocks="16384"', 'num_gpu_blocks="None"')
    r = get_adapter("vllm").parse(unprofiled, node_id="v", now=1.0)
    assert not r.stale and r.kv_capacity_tokens is None and r.extra["kv_block_size"] == 32.0


def test_sim_engine_speaks_vllm_names() -> None:
    r = get_adapter("sim").parse(sample("vllm.txt"), node_id="s", now=1.0)
    assert r.engine_type == "sim" and not r.stale and r.kv_capacity_tokens == 7281 * 16


def test_sglang_sample() -> None:
    r = get_adapter("sglang").parse(sample("sglang.txt"), node_id="g", now=5.0)
    assert not r.stale
    assert (r.running, r.waiting) == (0.0, 0.0)
    assert r.kv_usage == pytest.approx(0.25)
    assert r.kv_capacity_tokens == 430839
    # cached_tokens_total / prompt_tokens_total, not the per-batch gauge (0.2)
    assert r.extra["prefix_hits_total"] == 1.0 and r.extra["prefix_queries_total"] == 5.0
    assert r.prefix_hit_rate == pytest.approx(1 / 5)
    assert r.extra["generation_tokens_total"] == 32.0


def test_tgi_sample() -> None:
    r = get_adapter("tgi").parse(sample("tgi.txt"), node_id="t", now=5.0)
    assert not r.stale
    assert (r.running, r.waiting) == (0.0, 0.0)
    assert r.kv_capacity_tokens is None and r.kv_usage == 0.0 and r.prefix_hit_rate is None
    assert r.extra["prompt_tokens_total"] == 662.0
    assert r.extra["requests_total"] == 111.0


def test_llamacpp_sample_with_slots() -> None:
    adapter = LlamaCppAdapter()
    r = adapter.parse(
        sample("llamacpp.txt"),
        node_id="l",
        now=1.0,
        slots_text=sample("llamacpp_slots.json"),
    )
    assert not r.stale and r.engine_type == "llamacpp"
    assert r.extra["prompt_tokens_total"] > 0
    assert r.kv_capacity_tokens is not None and r.kv_capacity_tokens > 0
    assert 0.0 <= r.kv_usage <= 1.0
    # /metrics alone is still a usable report, KV unknown
    r2 = adapter.parse(sample("llamacpp.txt"), node_id="l", now=1.0, slots_text="<html>")
    assert not r2.stale and r2.kv_capacity_tokens is None


def test_llamacpp_busy_slots_give_kv_usage() -> None:
    slots = (
        '[{"id":0,"n_ctx":4096,"is_processing":true,"n_past":1024},'
        '{"id":1,"n_ctx":4096,"is_processing":false,"n_past":3000}]'
    )
    r = LlamaCppAdapter().parse(sample("llamacpp.txt"), node_id="l", now=1.0, slots_text=slots)
    assert r.kv_capacity_tokens == 8192
    assert r.kv_usage == pytest.approx(1024 / 8192)


def test_rates_from_counter_deltas() -> None:
    adapter = get_adapter("vllm")
    text0 = sample("vllm.txt")
    first = adapter.parse(text0, node_id="v", now=100.0)
    text1 = bump(text0, "vllm:prompt_tokens_total", 5.0 + 400)
    text1 = bump(text1, "vllm:generation_tokens_total", 7.0 + 100)
    text1 = bump(text1, "vllm:prefix_cache_queries_total", 117 + 400)
    text1 = bump(text1, "vllm:prefix_cache_hits_total", 64 + 300)
    second = adapter.parse(text1, node_id="v", now=102.0, previous=first)
    assert not second.counters_reset
    assert second.prompt_tokens_rate == pytest.approx(200.0)
    assert second.generation_tokens_rate == pytest.approx(50.0)
    assert second.prefix_hit_rate == pytest.approx(300 / 400)  # this scrape's window only
    # No traffic since: the last known hit rate stands, rates drop to zero.
    third = adapter.parse(text1, node_id="v", now=104.0, previous=second)
    assert third.prompt_tokens_rate == 0.0
    assert third.prefix_hit_rate == pytest.approx(0.75)


@pytest.mark.parametrize(
    ("engine", "file", "counter"),
    [
        ("vllm", "vllm.txt", "vllm:prompt_tokens_total"),
        ("vllm", "vllm.txt", "vllm:num_preemptions_total"),
        ("sglang", "sglang.txt", "sglang:generation_tokens_total"),
        ("tgi", "tgi.txt", "tgi_request_count"),
        ("llamacpp", "llamacpp.txt", "llamacpp:prompt_tokens_total"),
    ],
)
def test_counter_going_backwards_is_a_restart(engine: str, file: str, counter: str) -> None:
    adapter = get_adapter(engine)
    text = sample(file)
    high = bump(text, counter, 10_000)
    before = adapter.parse(high, node_id="n", now=10.0)
    after = adapter.parse(bump(text, counter, 3), node_id="n", now=13.0, previous=before)
    assert after.counters_reset
    assert after.prompt_tokens_rate == 0.0 and after.generation_tokens_rate == 0.0
    # The next scrape after the restart compares with the new baseline.
    later = adapter.parse(bump(text, counter, 3), node_id="n", now=16.0, previous=after)
    assert not later.counters_reset


def test_process_start_time_change_is_a_restart() -> None:
    adapter = get_adapter("vllm")
    text = sample("vllm.txt")
    before = adapter.parse(text, node_id="v", now=1.0)
    restarted = bump(text, "process_start_time_seconds", 1.7181409999e09)
    after = adapter.parse(restarted, node_id="v", now=4.0, previous=before)
    assert after.counters_reset and after.process_start_time == pytest.approx(1.7181409999e09)


def test_restart_is_noticed_across_a_failed_scrape() -> None:
    adapter = get_adapter("vllm")
    text = sample("vllm.txt")
    good = adapter.parse(bump(text, "vllm:prompt_tokens_total", 9000), node_id="v", now=1.0)
    failed = adapter.parse("garbage{", node_id="v", now=4.0, previous=good)
    assert failed.stale
    assert failed.extra["prompt_tokens_total"] == 9000  # carried forward
    back = adapter.parse(text, node_id="v", now=7.0, previous=failed)
    assert back.counters_reset


def test_rate_after_a_failed_scrape_uses_the_time_of_the_counters() -> None:
    adapter = get_adapter("vllm")
    text = sample("vllm.txt")
    good = adapter.parse(text, node_id="v", now=0.0)
    failed = adapter.parse("", node_id="v", now=3.0, previous=good)
    back = adapter.parse(
        bump(text, "vllm:prompt_tokens_total", 5 + 600), node_id="v", now=6.0, previous=failed
    )
    assert back.prompt_tokens_rate == pytest.approx(100.0)  # 600 tokens over 6 s, not 3 s


def test_v1_data_parallel_engines_are_summed() -> None:
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 2\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 3\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 1\n'
        'vllm:num_requests_waiting{engine="1",model_name="m"} 4\n'
        'vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 99\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.9\n'
        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5\n'
        'vllm:cache_config_info{engine="0",kv_cache_size_tokens="2197339",block_size="768"} 1.0\n'
        'vllm:cache_config_info{engine="1",num_gpu_blocks="100",block_size="16"} 1.0\n'
    )
    r = get_adapter("vllm").parse(text, node_id="v", now=0.0)
    assert (r.running, r.waiting) == (5.0, 5.0)
    assert r.kv_usage == pytest.approx(0.7)
    assert r.kv_capacity_tokens == 2197339 + 1600


def test_missing_required_gauges_is_stale() -> None:
    text = "# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total 4\n"
    assert get_adapter("vllm").parse(text, node_id="v", now=0.0).stale
    assert get_adapter("tgi").parse(sample("vllm.txt"), node_id="t", now=0.0).stale


def test_report_survives_json_round_trip() -> None:
    r = get_adapter("sglang").parse(sample("sglang.txt"), node_id="g", now=5.0)
    assert NodeReport.from_json(r.to_json()) == r


def test_parser_reads_escapes_timestamps_and_special_values() -> None:
    m = parse_metrics(
        '# HELP x a\n# TYPE x gauge\nx{a="q\\"u\\\\o\\nte",b=""} +Inf 1700000000000\n'
        "y NaN\nz -1.5e3\n# EOF\n"
    )
    (x,) = m.get("x")
    assert x.labels == {"a": 'q"u\\o\nte', "b": ""} and x.value == float("inf")
    assert m.total("y") == 0.0  # NaN samples are ignored in totals
    assert m.total("z") == -1500.0


@pytest.mark.parametrize(
    "bad",
    [
        "x 1",  # no final line feed: cut short
        "x{a=1} 2\n",
        'x{a="1" 2\n',
        "x\n",
        "x 1 2 3\n",
        "1x 2\n",
        "x one\n",
        "# TYPE\n",
        "",
    ],
)
def test_parser_refuses_malformed_text(bad: str) -> None:
    with pytest.raises(MetricsParseError):
        parse_metrics(bad)


def test_llamacpp_cached_tokens_are_prefix_hits() -> None:
    r = LlamaCppAdapter().parse(sample("llamacpp.txt"), node_id="l", now=1.0)
    # 1007 prompt tokens computed, 2002 reused from the cache (captured values)
    assert r.extra["prefix_hits_total"] == 2002
    assert r.extra["prefix_queries_total"] == 1007 + 2002
    assert r.prefix_hit_rate == pytest.approx(2002 / 3009)
    assert (r.running, r.waiting) == (1.0, 0.0)
