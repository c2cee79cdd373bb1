"""Gateway configuration: one YAML file, validated at load; errors name the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kvgate.adapters import ENGINE_TYPES
from kvgate.admission.config import AdmissionConfig
from kvgate.calibrate.config import CapacityProfileConfig
from kvgate.flags import unknown_flags, unknown_flags_message
from kvgate.kv_events.config import EVENT_ENGINE_TYPES, KvEventsConfig, NodeEventsConfig
from kvgate.pipeline.config import PipelineConfig
from kvgate.routing.config import RoutingConfig
from kvgate.tracing import TracingConfig
from kvgate.types import NodeSpec
from kvgate.yaml_file import read_yaml


class ConfigError(ValueError):
    """The configuration is invalid; the message names each offending field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ServerConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    gateway_id: str | None = None  # defaults to "<host>:<port>"
    max_body_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    upstream_timeout_s: float = Field(default=600.0, gt=0)  # whole upstream request
    connect_timeout_s: float = Field(default=3.0, gt=0)  # per attempt
    # per attempt: when no byte came this long, the engine's /health is probed and a hung
    # engine's attempt is retried elsewhere (a busy one is waited for)
    first_byte_timeout_s: float = Field(default=5.0, gt=0)
    idle_timeout_s: float = Field(default=60.0, gt=0)  # between a stream's chunks, per attempt
    upstream_pool_size: int = Field(default=512, gt=0)
    discover_timeout_s: float = Field(default=5.0, gt=0)  # how long to wait for /v1/models at start
    progress_batch_tokens: int = Field(default=16, gt=0)  # report generated tokens every N tokens
    # the generate endpoints' plain requests are served by kvgate.gateway.front (an asyncio
    # protocol) instead of aiohttp's server; false: aiohttp's server takes every request
    lean_front: bool = True


class NodeConfig(_Strict):
    id: str = Field(min_length=1)
    url: str
    model: str | None = None  # discovered from the backend's /v1/models when absent
    pool: str = "default"
    engine_type: str = "vllm"
    kv_capacity_tokens: int | None = Field(default=None, gt=0)
    model_version: str | None = None  # capacity profile reference (default: the model)
    deployment: str | None = None  # capacity profile reference (default: "default")
    kv_events: NodeEventsConfig | None = None  # the engine's KV event stream (ZMQ)

    @model_validator(mode="after")
    def _publishes_events(self) -> NodeConfig:
        if self.kv_events is not None and self.engine_type not in EVENT_ENGINE_TYPES:
            raise ValueError(
                f"kv_events: engine type {self.engine_type!r} publishes no KV events "
                f"(only {', '.join(EVENT_ENGINE_TYPES)})"
            )
        return self

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        v = v.rstrip("/")
        if v.endswith("/v1"):
            v = v[: -len("/v1")]
        return v

    @field_validator("engine_type")
    @classmethod
    def _engine(cls, v: str) -> str:
        if v not in ENGINE_TYPES:
            raise ValueError(f"must be one of {', '.join(ENGINE_TYPES)}")
        return v

    def spec(self, model: str | None = None) -> NodeSpec:
        return NodeSpec(
            node_id=self.id,
            url=self.url,
            model=model or self.model or "default",
            pool=self.pool,
            engine_type=self.engine_type,
            kv_capacity_tokens=self.kv_capacity_tokens,
        )


class AuthConfig(_Strict):
    # Without an admin token the admin API and dashboard answer only on a loopback bind.
    admin_token: str | None = None


class ScrapeConfig(_Strict):
    # "pull": the gateway scrapes each configured node's /metrics itself.
    # "registry": configured nodes are not scraped; sidecars report them via the store.
    # Nodes registered in the store by sidecars are picked up in both modes.
    mode: Literal["pull", "registry"] = "pull"
    timeout_s: float = Field(default=2.0, gt=0)


class GatewayConfig(_Strict):
    server: ServerConfig = Field(default_factory=ServerConfig)
    nodes: list[NodeConfig] = []
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    scrape: ScrapeConfig = Field(default_factory=ScrapeConfig)
    pipeline: PipelineConfig = Field(default_factory=PipelineConfig)  # retry budget, outliers
    kv_events: KvEventsConfig = Field(default_factory=KvEventsConfig)
    tracing: TracingConfig = Field(default_factory=TracingConfig)  # OpenTelemetry, off by default
    store: str = "memory://"
    flags: dict[str, bool] = {}
    capacity_profiles: list[CapacityProfileConfig] = []

    @field_validator("flags")
    @classmethod
    def _flags(cls, v: dict[str, bool]) -> dict[str, bool]:
        if unknown := unknown_flags(v):
            raise ValueError(unknown_flags_message(unknown))
        return v

    @field_validator("store")
    @classmethod
    def _store(cls, v: str) -> str:
        for part in v.split(","):
            if not part.startswith(("memory://", "redis://", "rediss://", "etcd://")):
                raise ValueError("must be memory://, redis://host:port, etcd://host:port or a pair")
        return v

    @model_validator(mode="after")
    def _unique_nodes(self) -> GatewayConfig:
        seen: set[str] = set()
        for i, node in enumerate(self.nodes):
            if node.id in seen:
                raise ValueError(f"nodes[{i}].id: duplicate node id {node.id!r}")
            seen.add(node.id)
        return self

    @property
    def gateway_id(self) -> str:
        return self.server.gateway_id or f"{self.server.host}:{self.server.port}"


def format_validation_error(exc: ValidationError) -> str:
    """``nodes[1].url: must start with http://`` — one line per error."""
    lines = []
    for err in exc.errors():
        path = ""
        for part in err["loc"]:
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"{path}: {msg}" if path else msg)
    return "; ".join(lines)


def parse_config(data: dict[str, Any] | None) -> GatewayConfig:
    try:
        return GatewayConfig.model_validate(data or {})
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None


def load_config(path: str | Path | None) -> dict[str, Any]:
    """Read the YAML file into a plain dict (validated later, after CLI overrides)."""
    if path is None:
        return {}
    data = read_yaml(path, ConfigError, "config file ")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return data
