"""Settings of the request pipeline shared by the gateway (YAML ``pipeline:``) and the simulator."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from kvgate.routing.outlier import OutlierConfig


class RetryBudgetConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ratio: float = Field(default=0.2, ge=0.0, le=1.0)  # retries ≤ ratio × requests …
    window_s: float = Field(default=10.0, gt=0)  # … over this sliding window
    min_retries: int = Field(default=3, ge=0)  # always allowed, so a quiet gateway retries


class PipelineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    retry_budget: RetryBudgetConfig = Field(default_factory=RetryBudgetConfig)
    outlier: OutlierConfig = Field(default_factory=OutlierConfig)
