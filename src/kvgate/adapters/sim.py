"""kvgate's simulated engine (``kvgate engine-sim``): it speaks vLLM's metric names."""

from __future__ import annotations

from kvgate.adapters.vllm import VllmAdapter


class SimAdapter(VllmAdapter):
    engine_type = "sim"
