"""Routing-layer configuration (validated at load; messages name the field)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kvgate.routing.known_policies import known_policy_names

# the node filters routing/filters.py defines, in their default order (its ``FILTERS``);
# here, not there, because the filters read this configuration
FILTER_NAMES = ("state", "pool", "model", "backoff_size", "endpoint")


class RouteKeyConfig(BaseModel):
    """What goes into the route key. User, session and API key never do."""

    model_config = ConfigDict(extra="forbid")

    include_system_prompt: bool = True
    include_tools: bool = True
    kb_version_header: str = "X-KB-Version"
    kb_version: str | None = None  # used when the request carries no header

    @field_validator("kb_version_header")
    @classmethod
    def _header_name(cls, value: str) -> str:
        if not value.strip() or any(c in value for c in " :\r\n"):
            raise ValueError("route_key.kb_version_header must be a non-empty HTTP header name")
        return value


class RoutingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policy: str = "hybrid"
    # which node filters run, in order (routing/filters.py); exclusions always apply
    filters: list[str] = Field(default_factory=lambda: list(FILTER_NAMES))
    # prefix index
    index_ttl_s: float = Field(default=120.0, gt=0)
    index_max_entries: int = Field(default=1_000_000, ge=1)
    route_key: RouteKeyConfig = Field(default_factory=RouteKeyConfig)
    route_key_cache_size: int = Field(default=4096, ge=1)
    # consistent hashing with bounded loads
    home_set_size: int = Field(default=1, ge=1)
    virtual_nodes: int = Field(default=100, ge=1)
    bounded_load_factor: float = Field(default=1.25, gt=1.0)
    # load score: requests + waiting_weight*waiting + tokens/tokens_per_load_unit + kv_weight*kv
    waiting_weight: float = Field(default=2.0, ge=0)
    tokens_per_load_unit: float = Field(default=4096.0, gt=0)
    kv_usage_weight: float = Field(default=4.0, ge=0)
    # spill by cost: a node's prefill rate (prompt tokens/s it computes when busy) and the
    # duration of one engine step; defaults are Llama-3.1-8B on one H100 (the engine
    # profile llama3-8b-h100). Queueing delay and re-prefill cost are both in seconds.
    prefill_tokens_per_s: float = Field(default=30_800.0, gt=0)
    prefill_step_s: float = Field(default=0.008, ge=0)
    # decode cost (engine profile): each running sequence adds decode_seq_s to every
    # engine step, and an engine with max_running sequences admits no more until one
    # finishes; 0 / None: not modelled (a GPU profile's per-sequence cost is negligible)
    decode_seq_s: float = Field(default=0.0, ge=0)
    max_running: int | None = Field(default=None, ge=1)
    # a spill must save at least this much predicted TTFT (seconds): keeps affinity
    # through noise in the queue estimate
    spill_margin_s: float = Field(default=0.0, ge=0)
    # a spill's re-prefill is paid twice: by this request (its TTFT) and by every request
    # queued behind it on the new node (the added work); 2 counts both, 1 only the former
    cache_weight: float = Field(default=2.0, ge=0)
    # balance: each unit of load score costs load_weight × prefill_step_s of predicted
    # TTFT (decode batches slow every step): a tiny prefix match does not pile new
    # conversations onto one node, a long one still wins
    load_weight: float = Field(default=0.05, ge=0)
    # cold boost: a node at boost 1 is scored as if this fraction of the prompt were cached
    cold_boost_weight: float = Field(default=0.5, ge=0)
    # node view
    freshness_s: float = Field(default=15.0, gt=0)
    scrape_interval_s: float = 3.0
    smoothing_window_s: float = Field(default=15.0, gt=0)
    warmup_s: float = Field(default=1800.0, gt=0)
    backoff_token_threshold: int = Field(default=2048, ge=0)
    # hit feedback
    feedback_shortfall_fraction: float = Field(default=0.5, gt=0, le=1.0)
    feedback_demote_after: int = Field(default=3, ge=1)
    # one full miss is an eviction the request itself just repaired: demote only on a run
    feedback_demote_on_full_miss: bool = False
    feedback_ewma_alpha: float = Field(default=0.2, gt=0, le=1.0)
    feedback_max_entries: int = Field(default=100_000, ge=1)
    # proxy
    max_retries: int = Field(default=2, ge=0, le=10)

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        names = known_policy_names()
        if value not in names:
            raise ValueError(f"policy must be one of {', '.join(sorted(names))}; got {value!r}")
        return value

    @field_validator("filters")
    @classmethod
    def _known_filters(cls, value: list[str]) -> list[str]:
        unknown = [f for f in value if f not in FILTER_NAMES]
        if unknown:
            raise ValueError(
                f"filters: unknown {', '.join(unknown)}; known: {', '.join(FILTER_NAMES)}"
            )
        if len(set(value)) != len(value):
            raise ValueError("filters: each filter may be named once")
        return value

    @field_validator("scrape_interval_s")
    @classmethod
    def _scrape_interval(cls, value: float) -> float:
        # Production deployments use 2–5 s; sub-second values exist for fast tests.
        if not 0.05 <= value <= 5.0:
            raise ValueError("scrape_interval_s must be between 0.05 and 5 seconds (2–5 typical)")
        return value

    @model_validator(mode="after")
    def _freshness_covers_scrapes(self) -> RoutingConfig:
        if self.freshness_s < self.scrape_interval_s:
            raise ValueError("freshness_s must be at least scrape_interval_s")
        return self
