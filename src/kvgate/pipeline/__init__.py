"""The request pipeline: one object, two drivers (the gateway's proxy and the simulator)."""

from kvgate.pipeline.config import PipelineConfig, RetryBudgetConfig
from kvgate.pipeline.engine_usage import engine_kv_capacity, engine_kv_tokens, headroom_signal
from kvgate.pipeline.models import UnknownModel, resolve_model
from kvgate.pipeline.pipeline import (
    Admission,
    AttemptOutcome,
    Failure,
    Flow,
    GiveUp,
    RequestPipeline,
    retryable_status,
)

__all__ = [
    "Admission",
    "AttemptOutcome",
    "Failure",
    "Flow",
    "GiveUp",
    "PipelineConfig",
    "RequestPipeline",
    "RetryBudgetConfig",
    "UnknownModel",
    "engine_kv_capacity",
    "engine_kv_tokens",
    "headroom_signal",
    "resolve_model",
    "retryable_status",
]
