"""Admission configuration (validated at load; errors name the field)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DegradeMode = Literal["low_priority", "async", "economy_pool"]
FailureMode = Literal["fail-open-local", "fail-closed"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class TenantConfig(_Strict):
    name: str = Field(min_length=1)
    api_keys: list[str] = []
    guaranteed: int = Field(default=0, ge=0, description="tokens always available to the tenant")
    guaranteed_fraction: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="guarantee as a fraction of the live total (follows the dynamic quota)",
    )
    weight: float = Field(default=1.0, gt=0, description="share of spare capacity")
    hard_cap: int | None = Field(default=None, ge=1, description="never more than this in flight")
    priority_min: int = 0
    priority_max: int = 0
    default_priority: int | None = None
    default_class: str = "interactive"
    # the priority classes this tenant's key may ask for (X-KVGate-Class); empty: only
    # default_class. A header never widens what the key allows.
    classes: list[str] = []

    @model_validator(mode="after")
    def _ranges(self) -> TenantConfig:
        if self.classes and self.default_class not in self.classes:
            raise ValueError(f"default_class {self.default_class!r} must be one of classes")
        if self.priority_min > self.priority_max:
            raise ValueError("priority_min must be <= priority_max")
        if self.default_priority is not None and not (
            self.priority_min <= self.default_priority <= self.priority_max
        ):
            raise ValueError("default_priority must lie within priority_min..priority_max")
        if self.guaranteed_fraction is not None and self.guaranteed:
            raise ValueError("set guaranteed or guaranteed_fraction, not both")
        if self.hard_cap is not None and self.hard_cap < self.guaranteed:
            raise ValueError("hard_cap must be >= guaranteed")
        return self


class QueueConfig(_Strict):
    default_deadline_s: float = Field(default=30.0, gt=0)
    class_deadlines_s: dict[str, float] = {}
    max_queue_tokens: int = Field(default=200_000, ge=0, description="per tenant, 0 = no queue")
    long_request_reserved_fraction: float = Field(default=0.10, ge=0, lt=1)
    long_request_threshold_tokens: int = Field(default=2048, ge=1)
    quantum_tokens: int = Field(default=1024, ge=1, description="DRR quantum per round")
    standing_after_s: float = Field(
        default=1.0,
        gt=0,
        description="a tenant's queue never empty for this long is standing (engines saturated)",
    )
    standing_wait_s: dict[str, float] = Field(
        default={"interactive": 0.25},
        description="class → longest wait in a standing queue, then 429 overloaded; "
        "classes not listed wait until their deadline",
    )

    @model_validator(mode="after")
    def _waits(self) -> QueueConfig:
        for name, wait in self.standing_wait_s.items():
            if wait <= 0:
                raise ValueError(f"standing_wait_s.{name} must be > 0")
        return self

    def deadline_for(self, priority_class: str) -> float:
        return self.class_deadlines_s.get(priority_class, self.default_deadline_s)


class OutputBoundConfig(_Strict):
    """The output bound a reservation covers when the client sends no max_tokens."""

    default_max_tokens: int = Field(default=1024, ge=1, description="any model not listed")
    model_max_tokens: dict[str, int] = Field(default={}, description="model → default bound")
    model_context_tokens: dict[str, int] = Field(
        default={}, description="model → context length (prompt + output never exceed it)"
    )

    def bound(self, model: str, prompt_tokens: int, max_tokens: int | None) -> int:
        """Output tokens to reserve: the client's max_tokens, else the model's default,
        clamped so prompt + output fit the model's context (at least 1). ``max_tokens``
        0 is a request that decodes nothing (embeddings, rerank, tokenize): 0."""
        if max_tokens == 0:
            return 0
        out = (
            max_tokens
            if max_tokens is not None
            else self.model_max_tokens.get(model, self.default_max_tokens)
        )
        context = self.model_context_tokens.get(model)
        if context is not None:
            out = min(out, context - prompt_tokens)
        return max(1, out)


class DynamicQuotaConfig(_Strict):
    interval_s: float = Field(default=25.0, ge=20.0, le=30.0)
    tighten_above: float = Field(default=0.80, gt=0, le=1, description="of KV capacity")
    relax_below: float = Field(default=0.50, ge=0, lt=1, description="of KV capacity")
    min_total: int = Field(default=1024, ge=1)
    max_step: float = Field(default=4.0, gt=1, le=16, description="largest factor per period")
    ttft_class: str = Field(default="interactive", description="class whose latency is watched")
    ttft_slo_s: float = Field(default=1.0, gt=0, description="that class's TTFT SLO")
    ttft_target_fraction: float = Field(
        default=0.75, gt=0, le=1, description="admission → first token p-th percentile target"
    )
    ttft_percentile: float = Field(default=99.0, gt=0, le=100)
    min_samples: int = Field(default=20, ge=1, description="first tokens needed to judge TTFT")
    settle_fraction: float = Field(
        default=0.4, ge=0, lt=1, description="part of a period not judged after its first admission"
    )
    precision: float = Field(default=1.1, gt=1, description="brackets this close: converged")
    memory_periods: int = Field(default=6, ge=1, description="how long a bracket is trusted")
    check_s: float = Field(
        default=5.0, gt=0, description="between breach checks inside a period (≤ interval_s)"
    )
    breach_ratio: float = Field(
        default=2.0,
        gt=1,
        description="a check's first-token percentile over this × the target cuts at once",
    )
    breach_decrease: float = Field(
        default=0.91, gt=0, lt=1, description="factor a breach multiplies the total by"
    )

    @model_validator(mode="after")
    def _order(self) -> DynamicQuotaConfig:
        if self.relax_below >= self.tighten_above:
            raise ValueError("relax_below must be < tighten_above")
        if self.check_s > self.interval_s:
            raise ValueError("check_s must be <= interval_s")
        return self


class PrefillGateConfig(_Strict):
    """The prefill gate (prefill_gate.py; flag ``prefill_gate``)."""

    target_s: float = Field(
        default=0.4, gt=0, description="admission → first-token percentile the gate aims at"
    )
    percentile: float = Field(default=90.0, gt=0, le=100)
    initial_tokens: int = Field(
        default=32_768, ge=1, description="pending-prefill limit before anything is measured"
    )
    min_tokens: int = Field(default=4096, ge=1)
    max_tokens: int = Field(default=4_000_000, ge=1)
    adapt_s: float = Field(default=0.5, gt=0, description="between limit updates")
    max_growth: float = Field(default=2.0, gt=1, description="largest factor per update")
    min_samples: int = Field(default=4, ge=1, description="first tokens needed to update")
    priority_classes: list[str] = Field(
        default=["interactive"], description="classes that may fill the whole limit"
    )
    other_share: float = Field(
        default=0.5, gt=0, le=1, description="part of the limit other classes may fill"
    )

    @model_validator(mode="after")
    def _range(self) -> PrefillGateConfig:
        if self.min_tokens > self.max_tokens:
            raise ValueError("min_tokens must be <= max_tokens")
        return self


class HeadroomConfig(_Strict):
    """When the engines have room for more work (headroom.py; flag ``fail_open``).

    Every eligible engine must have a fresh report with at most ``max_waiting`` requests
    in its queue and KV use below ``kv_usage_below``, and at most ``max_inflight_growth``
    requests dispatched to it since that report or in flight on it beyond the report's
    running and waiting (a report is up to a scrape interval old: this bounds what failing
    open may send before the next one)."""

    max_waiting: float = Field(default=0.0, ge=0, description="engine queue length still idle")
    kv_usage_below: float = Field(default=0.8, gt=0, le=1, description="KV use still idle")
    max_inflight_growth: int = Field(
        default=8, ge=0, description="requests in flight beyond the report's running + waiting"
    )
    episode_gap_s: float = Field(
        default=30.0, gt=0, description="a hold this long after the last starts a new episode"
    )


class DegradeConfig(_Strict):
    # priority class → how over-quota work of that class is degraded
    modes: dict[str, DegradeMode] = {}  # e.g. {"batch": "async"}
    economy_pool: str = "economy"
    over_quota: DegradeMode | None = None  # any class over its share, when set
    async_deadline_s: float = Field(
        default=600.0, gt=0, description="how long async work may wait in the admission queue"
    )


class AdmissionConfig(_Strict):
    total_quota: int = Field(default=1_000_000, ge=1, description="cluster runtime tokens")
    absolute_hard_cap: int | None = Field(default=None, ge=1)
    tenants: list[TenantConfig] = []
    queue: QueueConfig = Field(default_factory=QueueConfig)
    dynamic_quota: DynamicQuotaConfig = Field(default_factory=DynamicQuotaConfig)
    degrade: DegradeConfig = Field(default_factory=DegradeConfig)
    prefill_gate: PrefillGateConfig = Field(default_factory=PrefillGateConfig)
    headroom: HeadroomConfig = Field(default_factory=HeadroomConfig)
    failure_mode: FailureMode = "fail-open-local"
    local_share: float = Field(default=0.5, gt=0, le=1, description="of total when store is down")
    lease_ttl_s: float = Field(default=10.0, gt=0)
    heartbeat_s: float | None = Field(default=None, gt=0, description="default lease_ttl_s / 3")
    async_job_ttl_s: float = Field(default=3600.0, gt=0)
    output: OutputBoundConfig = Field(default_factory=OutputBoundConfig)
    overcommit: float = Field(
        default=1.0,
        ge=1.0,
        le=4.0,
        description="admit up to total × overcommit reserved tokens (1.0 = never over-admit)",
    )
    default_tenant: str = "default"

    @model_validator(mode="after")
    def _check(self) -> AdmissionConfig:
        names = [t.name for t in self.tenants]
        for i, name in enumerate(names):
            if names.index(name) != i:
                raise ValueError(f"tenants[{i}].name: duplicate tenant {name!r}")
        seen: dict[str, str] = {}
        for i, t in enumerate(self.tenants):
            for key in t.api_keys:
                if key in seen:
                    raise ValueError(f"tenants[{i}].api_keys: key already used by {seen[key]!r}")
                seen[key] = t.name
        cap = self.absolute_hard_cap
        if cap is not None and self.total_quota > cap:
            raise ValueError("total_quota must be <= absolute_hard_cap")
        fractions = sum(t.guaranteed_fraction or 0.0 for t in self.tenants)
        guaranteed = sum(t.guaranteed for t in self.tenants) + int(fractions * self.total_quota)
        if fractions > 1:
            raise ValueError(f"tenants: guaranteed_fraction sums to {fractions:.3f}, above 1")
        if guaranteed > self.total_quota:
            raise ValueError(
                f"tenants: guarantees sum to {guaranteed}, above total_quota {self.total_quota}"
            )
        return self

    @property
    def heartbeat_interval_s(self) -> float:
        return self.heartbeat_s if self.heartbeat_s is not None else self.lease_ttl_s / 3

    def tenant(self, name: str) -> TenantConfig:
        for t in self.tenants:
            if t.name == name:
                return t
        return TenantConfig(name=name)
