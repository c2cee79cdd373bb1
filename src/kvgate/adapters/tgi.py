"""Hugging Face Text Generation Inference (``tgi_`` metrics).

TGI exports its queue and current batch but neither KV usage nor prefix-cache hits, so
those stay unknown (kv_usage 0, prefix_hit_rate None); capacity comes from NodeSpec.
"""

from __future__ import annotations

from kvgate.adapters.base import (
    GENERATION_TOKENS,
    PROMPT_TOKENS,
    REQUESTS,
    EngineAdapter,
    Observation,
    finite,
    require,
)
from kvgate.adapters.prom import MetricSet
from kvgate.adapters.vllm import PROCESS_START, counters


class TgiAdapter(EngineAdapter):
    engine_type = "tgi"

    def observe(self, metrics: MetricSet) -> Observation:
        return Observation(
            running=require(metrics, "tgi_batch_current_size"),
            waiting=require(metrics, "tgi_queue_size"),
            process_start_time=finite(metrics.maximum(PROCESS_START)),
            # Token totals are the sums of the per-request length histograms.
            counters=counters(
                metrics,
                {
                    PROMPT_TOKENS: "tgi_request_input_length_sum",
                    GENERATION_TOKENS: "tgi_request_generated_tokens_sum",
                    REQUESTS: "tgi_request_count",
                },
            ),
        )
