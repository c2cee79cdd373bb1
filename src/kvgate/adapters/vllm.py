"""vLLM (``vllm:`` metrics, V0 and V1 engines)."""

from __future__ import annotations

from kvgate.adapters.base import (
    GENERATION_TOKENS,
    PREEMPTIONS,
    PREFIX_HITS,
    PREFIX_QUERIES,
    PROMPT_TOKENS,
    REQUESTS,
    EngineAdapter,
    Observation,
    finite,
    require,
)
from kvgate.adapters.prom import MetricSet

PROCESS_START = "process_start_time_seconds"
# Observation.extra key: the engine's KV block size in tokens (cache_config_info's
# block_size label), what KV-event block hashes must be computed with.
KV_BLOCK_SIZE = "kv_block_size"


def kv_capacity_from_cache_config(metrics: MetricSet, name: str) -> int | None:
    """KV capacity in tokens from an info gauge's labels, summed over engines.

    Newer vLLM states it as ``kv_cache_size_tokens``; older ones as num_gpu_blocks ×
    block_size.
    """
    total = 0
    for sample in metrics.get(name):
        tokens = sample.labels.get("kv_cache_size_tokens", "")
        if tokens.isdigit():
            total += int(tokens)
            continue
        try:
            total += int(sample.labels["num_gpu_blocks"]) * int(sample.labels["block_size"])
        except (KeyError, ValueError):
            continue  # e.g. num_gpu_blocks="None" before the profiler ran
    return total or None


def block_size_from_cache_config(metrics: MetricSet, name: str) -> int | None:
    """The KV block size in tokens from an info gauge's ``block_size`` label; None when no
    engine states one or the engines behind the port disagree."""
    sizes = {
        int(label)
        for sample in metrics.get(name)
        if (label := sample.labels.get("block_size", "")).isdigit() and int(label) > 0
    }
    return sizes.pop() if len(sizes) == 1 else None


def counters(metrics: MetricSet, names: dict[str, str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, name in names.items():
        value = finite(metrics.total(name))
        if value is not None:
            out[key] = value
    return out


class VllmAdapter(EngineAdapter):
    engine_type = "vllm"
    prefix = "vllm:"

    def observe(self, metrics: MetricSet) -> Observation:
        p = self.prefix
        names = {
            PROMPT_TOKENS: f"{p}prompt_tokens_total",
            GENERATION_TOKENS: f"{p}generation_tokens_total",
            PREFIX_QUERIES: f"{p}prefix_cache_queries_total",
            PREFIX_HITS: f"{p}prefix_cache_hits_total",
            PREEMPTIONS: f"{p}num_preemptions_total",
            REQUESTS: f"{p}request_success_total",
        }
        block_size = block_size_from_cache_config(metrics, f"{p}cache_config_info")
        return Observation(
            running=require(metrics, f"{p}num_requests_running"),
            waiting=require(metrics, f"{p}num_requests_waiting"),
            # V1 renamed gpu_cache_usage_perc to kv_cache_usage_perc.
            kv_usage=metrics.first_mean((f"{p}kv_cache_usage_perc", f"{p}gpu_cache_usage_perc")),
            kv_capacity_tokens=kv_capacity_from_cache_config(metrics, f"{p}cache_config_info"),
            # V0 only had a hit-rate gauge; V1 has token counters (preferred, windowed).
            prefix_hit_rate=None
            if metrics.has(f"{p}prefix_cache_queries_total")
            else metrics.mean(f"{p}gpu_prefix_cache_hit_rate"),
            process_start_time=finite(metrics.maximum(PROCESS_START)),
            counters=counters(metrics, names),
            extra={} if block_size is None else {KV_BLOCK_SIZE: float(block_size)},
        )
