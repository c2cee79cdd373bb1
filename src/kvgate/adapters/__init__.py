"""Engine adapters: each engine's /metrics → one normalised ``NodeReport``.

``get_adapter(engine_type)`` returns the adapter for "vllm", "sglang", "tgi",
"llamacpp" or "sim"; ``adapter.parse(text, node_id=, now=, previous=)`` and
``await adapter.scrape(session, base_url, node_id=, now=, previous=)`` never raise.
"""

from __future__ import annotations

from kvgate.adapters.base import EngineAdapter, Observation
from kvgate.adapters.llamacpp import LlamaCppAdapter
from kvgate.adapters.sglang import SglangAdapter
from kvgate.adapters.sim import SimAdapter
from kvgate.adapters.tgi import TgiAdapter
from kvgate.adapters.vllm import VllmAdapter

ADAPTERS: dict[str, type[EngineAdapter]] = {
    "vllm": VllmAdapter,
    "sglang": SglangAdapter,
    "tgi": TgiAdapter,
    "llamacpp": LlamaCppAdapter,
    "sim": SimAdapter,
}
ENGINE_TYPES = tuple(ADAPTERS)


def get_adapter(engine_type: str) -> EngineAdapter:
    try:
        return ADAPTERS[engine_type]()
    except KeyError:
        raise ValueError(
            f"engine_type {engine_type!r} is not one of {', '.join(ENGINE_TYPES)}"
        ) from None


__all__ = [
    "ADAPTERS",
    "ENGINE_TYPES",
    "EngineAdapter",
    "LlamaCppAdapter",
    "Observation",
    "SglangAdapter",
    "SimAdapter",
    "TgiAdapter",
    "VllmAdapter",
    "get_adapter",
]
