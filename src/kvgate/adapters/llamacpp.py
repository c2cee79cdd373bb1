"""llama.cpp's ``llama-server`` (``llamacpp:`` metrics with ``--metrics``, slots with ``--slots``).

Its /metrics has live ``requests_processing`` / ``requests_deferred`` gauges and token
counters but no KV gauge, so KV usage and capacity come from /slots: each slot owns a
context of ``n_ctx`` tokens, and a processing slot holds its prompt plus what it decoded.
Some versions put prompt text in /slots; it is read for nothing and never logged.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import aiohttp

from kvgate.adapters.base import (
    GENERATION_TOKENS,
    PREFIX_HITS,
    PREFIX_QUERIES,
    PROMPT_TOKENS,
    EngineAdapter,
    Observation,
    fetch_text,
    join_url,
    require,
)
from kvgate.adapters.prom import MetricSet
from kvgate.adapters.vllm import counters

log = logging.getLogger(__name__)


class SlotsError(ValueError):
    """/slots did not return a JSON list of slot objects."""


def parse_slots(text: str) -> list[dict[str, Any]]:
    data = json.loads(text)
    if not isinstance(data, list) or not all(isinstance(s, dict) for s in data):
        raise SlotsError("/slots is not a list of objects")
    return data


def slot_usage(slots: list[dict[str, Any]]) -> tuple[float | None, int | None, int]:
    """(KV usage 0..1, capacity in tokens, busy slots) from /slots."""
    capacity = 0
    used = 0
    busy = 0
    for slot in slots:
        n_ctx = slot.get("n_ctx")
        if isinstance(n_ctx, int) and n_ctx > 0:
            capacity += n_ctx
        if slot.get("is_processing"):
            busy += 1
            used += _slot_tokens(slot)
    if capacity <= 0:
        return None, None, busy
    return min(1.0, used / capacity), capacity, busy


def _slot_tokens(slot: dict[str, Any]) -> int:
    for key in ("n_past", "n_ctx_used", "n_prompt_tokens"):
        value = slot.get(key)
        if isinstance(value, int) and value >= 0:
            decoded = slot.get("next_token", {})
            if isinstance(decoded, list):
                decoded = decoded[0] if decoded else {}
            extra = decoded.get("n_decoded", 0) if isinstance(decoded, dict) else 0
            return value + (extra if key == "n_prompt_tokens" and isinstance(extra, int) else 0)
    return 0


class LlamaCppAdapter(EngineAdapter):
    engine_type = "llamacpp"
    slots_path = "/slots"

    def observe(self, metrics: MetricSet) -> Observation:
        found = counters(
            metrics,
            {
                # prompt_tokens_total excludes cached tokens; prompt_tokens_cached_total
                # counts those reused from the prefix cache.
                PROMPT_TOKENS: "llamacpp:prompt_tokens_total",
                PREFIX_HITS: "llamacpp:prompt_tokens_cached_total",
                GENERATION_TOKENS: "llamacpp:tokens_predicted_total",
            },
        )
        if PREFIX_HITS in found and PROMPT_TOKENS in found:
            found[PREFIX_QUERIES] = found[PROMPT_TOKENS] + found[PREFIX_HITS]
            # kvgate's prompt token rate counts every prompt token, like vLLM's counter.
            found[PROMPT_TOKENS] = found[PREFIX_QUERIES]
        return Observation(
            running=require(metrics, "llamacpp:requests_processing"),
            waiting=require(metrics, "llamacpp:requests_deferred"),
            counters=found,
        )

    def observe_extra(self, obs: Observation, extra: dict[str, Any], *, node_id: str) -> None:
        slots_text = extra.get("slots_text")
        if slots_text is not None:
            try:
                usage, capacity, _busy = slot_usage(parse_slots(slots_text))
                obs.kv_usage, obs.kv_capacity_tokens = usage, capacity
            except Exception as exc:
                # /metrics alone is still a usable report; only KV stays unknown.
                log.debug("node %s: unusable /slots: %s", node_id, exc)

    async def fetch_extra(
        self, session: aiohttp.ClientSession, base_url: str, *, node_id: str, timeout_s: float
    ) -> dict[str, Any]:
        """llama.cpp has no KV gauge: read /slots too."""
        try:
            return {
                "slots_text": await fetch_text(
                    session, join_url(base_url, self.slots_path), timeout_s
                )
            }
        except Exception as exc:  # /slots disabled (501) or busy: report without KV
            log.debug("node %s: /slots failed: %s", node_id, exc)
            return {"slots_text": None}
