"""Capacity calibration: a load test finds an engine's latency knee (``kvgate calibrate``).

``calibrate(RampConfig, model_version=, deployment=)`` runs the ramp and returns a
``CapacityProfile`` (or raises ``NoKnee``); ``CapacityBook`` maps nodes to profiles for
the gateway's quota total.
"""

from __future__ import annotations

import time

from kvgate.calibrate.knee import Knee, KneeRule, StepStats, find_knee
from kvgate.calibrate.profile import (
    CAPACITY_PREFIX,
    CapacityProfile,
    ProfileError,
    load_profile_file,
    profile_key,
)
from kvgate.calibrate.ramp import RampConfig, RampResult, StepResult, run_ramp


class NoKnee(RuntimeError):
    """The ramp ended without finding the knee (bounds hit, or the first step was bad)."""

    def __init__(self, message: str, result: RampResult) -> None:
        super().__init__(message)
        self.result = result


def profile_from_ramp(
    result: RampResult, *, model_version: str, deployment: str, engine_type: str
) -> CapacityProfile:
    knee, step = result.knee, result.knee_step
    if step is None or not knee.reached:
        last = result.steps[-1].concurrency if result.steps else 0
        why = (
            "the first step is already past the knee"
            if knee.reached
            else f"no knee up to concurrency {last} (stopped by {result.stopped_by})"
        )
        raise NoKnee(f"calibrate: {why}", result)
    return CapacityProfile(
        model_version=model_version or result.model or "default",
        deployment=deployment,
        context=result.config.context,
        capacity_runtime_tokens=max(1, round(step.runtime_tokens)),
        knee_concurrency=step.concurrency,
        ttft_p99_at_knee=round(step.ttft_p99, 6),
        measured_at=round(time.time(), 3),
        details={
            "engine_type": engine_type,
            "model": result.model,
            "target": result.config.target,
            "output_tokens": result.config.output_tokens,
            "rule_fired": knee.reason,
            "past_knee_concurrency": result.sorted_steps()[knee.past_index].concurrency
            if knee.past_index is not None
            else None,
            "flat_ttft_p99": round(knee.flat_ttft_p99, 6),
            "latency_source": step.latency_source,
            "runtime_tokens_source": step.runtime_tokens_source,
            "requests_sent": result.requests_sent,
            "elapsed_s": round(result.elapsed_s, 2),
        },
    )


async def calibrate(
    config: RampConfig, *, model_version: str = "", deployment: str = "default"
) -> tuple[CapacityProfile, RampResult]:
    result = await run_ramp(config)
    profile = profile_from_ramp(
        result, model_version=model_version, deployment=deployment, engine_type=config.engine_type
    )
    return profile, result


__all__ = [
    "CAPACITY_PREFIX",
    "CapacityProfile",
    "Knee",
    "KneeRule",
    "NoKnee",
    "ProfileError",
    "RampConfig",
    "RampResult",
    "StepResult",
    "StepStats",
    "calibrate",
    "find_knee",
    "load_profile_file",
    "profile_from_ramp",
    "profile_key",
    "run_ramp",
]
