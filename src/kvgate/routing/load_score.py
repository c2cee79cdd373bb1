"""A node's load score: what balance terms and bounded-load hashing compare.

    requests + (waiting_weight − 1) × waiting + in-flight tokens / tokens_per_load_unit
    + kv_usage_weight × KV usage

``requests`` is the larger of what the engine last reported (running + waiting + what
this gateway dispatched since) and this gateway's own in-flight count, so load rises at
dispatch, before the engine's next report shows it. It is a balance signal, not a TTFT
estimate: TTFT is driven by the prefill backlog (``prefill_queue.py``).
"""

from __future__ import annotations

from kvgate.routing.config import RoutingConfig
from kvgate.types import NodeReport


def load_score(
    report: NodeReport | None,
    *,
    unreported: int,
    inflight_requests: int,
    inflight_tokens: int,
    config: RoutingConfig,
) -> float:
    running = report.running if report else 0.0
    waiting = report.waiting if report else 0.0
    kv = report.kv_usage if report else 0.0
    requests = max(running + waiting + unreported, inflight_requests)
    return (
        requests
        + (config.waiting_weight - 1.0) * waiting
        + inflight_tokens / config.tokens_per_load_unit
        + config.kv_usage_weight * kv
    )
