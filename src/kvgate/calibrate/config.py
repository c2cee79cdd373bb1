"""Capacity profiles inside the gateway config (``capacity_profiles:``), validated at load."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from kvgate.calibrate.profile import CapacityProfile


class CapacityProfileConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model_version: str = Field(min_length=1)
    deployment: str = Field(default="default", min_length=1)
    context: int = Field(ge=1)
    capacity_runtime_tokens: int = Field(ge=1)
    knee_concurrency: int = Field(ge=1)
    ttft_p99_at_knee: float = Field(ge=0)
    measured_at: float = 0.0
    details: dict[str, object] = {}

    def profile(self) -> CapacityProfile:
        return CapacityProfile.from_dict(self.model_dump())
