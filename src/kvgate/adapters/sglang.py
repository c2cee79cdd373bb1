"""SGLang (``sglang:`` metrics, server started with ``--enable-metrics``)."""

from __future__ import annotations

from kvgate.adapters.base import (
    GENERATION_TOKENS,
    PREFIX_HITS,
    PREFIX_QUERIES,
    PROMPT_TOKENS,
    REQUESTS,
    EngineAdapter,
    MissingMetric,
    Observation,
    finite,
)
from kvgate.adapters.prom import MetricSet, Sample
from kvgate.adapters.vllm import PROCESS_START


def _rank0(samples: list[Sample]) -> list[Sample]:
    # Under tensor parallelism every rank may export the same scheduler numbers.
    return [s for s in samples if s.labels.get("tp_rank", "0") == "0"]


class SglangAdapter(EngineAdapter):
    engine_type = "sglang"

    def observe(self, metrics: MetricSet) -> Observation:
        def total(name: str) -> float | None:
            found = _rank0(metrics.get(f"sglang:{name}"))
            return finite(sum(s.value for s in found)) if found else None

        def mean(name: str) -> float | None:
            found = _rank0(metrics.get(f"sglang:{name}"))
            return finite(sum(s.value for s in found) / len(found)) if found else None

        running, waiting = total("num_running_reqs"), total("num_queue_reqs")
        if running is None or waiting is None:
            raise MissingMetric("sglang:num_running_reqs / sglang:num_queue_reqs missing")
        counters: dict[str, float] = {}
        for key, name in (
            (PROMPT_TOKENS, "prompt_tokens_total"),
            (GENERATION_TOKENS, "generation_tokens_total"),
            (REQUESTS, "num_requests_total"),
        ):
            value = total(name)
            if value is not None:
                counters[key] = value
        cached = total("cached_tokens_total")
        if cached is not None and PROMPT_TOKENS in counters:
            # prompt_tokens_total counts every prompt token, cached ones included, so the
            # pair gives a token hit rate over any window (the gauge is per batch).
            counters[PREFIX_HITS] = cached
            counters[PREFIX_QUERIES] = counters[PROMPT_TOKENS]
        capacity = total("max_total_num_tokens")
        extra: dict[str, float] = {}
        retracted = total("num_retracted_reqs")
        if retracted is not None:
            extra["retracted_requests"] = retracted
        return Observation(
            running=running,
            waiting=waiting,
            kv_usage=mean("token_usage"),
            kv_capacity_tokens=int(capacity) if capacity else None,
            prefix_hit_rate=None if PREFIX_HITS in counters else mean("cache_hit_rate"),
            process_start_time=finite(metrics.maximum(PROCESS_START)),
            counters=counters,
            extra=extra,
        )
