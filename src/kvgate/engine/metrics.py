"""Prometheus metrics with vLLM's names, types and labels (model_name, engine).

Names and label sets follow vLLM v1 ``vllm/v1/metrics/loggers.py`` (see
docs/engine-model.md). Gauges and counters are refreshed from ``EngineCore.stats()`` at
scrape time; histograms are observed as requests finish. Times are simulated seconds
(the profile's time, independent of ``--time-scale``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.process_collector import ProcessCollector

from kvgate.engine.core import EngineStats

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
TPOT_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip

LABELS = ("model_name", "engine")


class EngineMetrics:
    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        model_name: str,
        engine: str,
        block_size: int,
        num_gpu_blocks: int,
        process_collector: bool = True,
    ) -> None:
        lv = (model_name, engine)
        r = registry
        self.running = Gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.",
            LABELS, registry=r,
        ).labels(*lv)  # fmt: skip
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.",
            LABELS, registry=r,
        ).labels(*lv)  # fmt: skip
        self.kv_usage = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
            LABELS, registry=r,
        ).labels(*lv)  # fmt: skip
        self.prefix_queries = Counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            LABELS, registry=r,
        ).labels(*lv)  # fmt: skip
        self.prefix_hits = Counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
            LABELS, registry=r,
        ).labels(*lv)  # fmt: skip
        self.preemptions = Counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.",
            LABELS, registry=r,
        ).labels(*lv)  # fmt: skip
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", LABELS, registry=r
        ).labels(*lv)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.",
            LABELS, registry=r,
        ).labels(*lv)  # fmt: skip
        success = Counter(
            "vllm:request_success", "Count of successfully processed requests.",
            (*LABELS, "finished_reason"), registry=r,
        )  # fmt: skip
        self.success = {reason: success.labels(*lv, reason) for reason in ("stop", "length")}
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            LABELS, buckets=TTFT_BUCKETS, registry=r,
        ).labels(*lv)  # fmt: skip
        self.tpot = Histogram(
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            LABELS, buckets=TPOT_BUCKETS, registry=r,
        ).labels(*lv)  # fmt: skip
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            LABELS, buckets=LATENCY_BUCKETS, registry=r,
        ).labels(*lv)  # fmt: skip
        Gauge(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
            ("engine", "block_size", "num_gpu_blocks", "enable_prefix_caching"), registry=r,
        ).labels(engine, str(block_size), str(num_gpu_blocks), "True").set(1)  # fmt: skip
        if process_collector:
            ProcessCollector(registry=r)
        self._last = EngineStats(0, 0, 0.0, num_gpu_blocks, num_gpu_blocks, 0, 0, 0, 0, 0, 0, 0, 0)

    def refresh(self, s: EngineStats) -> None:
        """Bring gauges and counters up to date with a stats snapshot."""
        last = self._last
        self.running.set(s.running)
        self.waiting.set(s.waiting)
        self.kv_usage.set(s.kv_usage)
        self.prefix_queries.inc(s.prefix_cache_queries - last.prefix_cache_queries)
        self.prefix_hits.inc(s.prefix_cache_hits - last.prefix_cache_hits)
        self.preemptions.inc(s.preemptions - last.preemptions)
        self.prompt_tokens.inc(s.prompt_tokens - last.prompt_tokens)
        self.generation_tokens.inc(s.generation_tokens - last.generation_tokens)
        self._last = s

    def observe_finished(
        self, *, ttft: float, e2e: float, output_tokens: int, finish_reason: str
    ) -> None:
        self.ttft.observe(ttft)
        self.e2e.observe(e2e)
        if output_tokens > 1:
            self.tpot.observe((e2e - ttft) / (output_tokens - 1))
        self.success[finish_reason].inc()
