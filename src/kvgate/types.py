"""Plain data shared by the engine, routing, admission, stores, sidecar and simulator."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class NodeState(StrEnum):
    HEALTHY = "healthy"
    BACKOFF = "backoff"  # overloaded: only short requests
    QUIESCING = "quiescing"  # draining: no new requests, in-flight ones finish
    REREGISTER = "re-register"  # restarted: index entries purged, cold boost applies
    UNREACHABLE = "unreachable"  # no fresh report within the freshness limit


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """A backend engine the gateway can route to."""

    node_id: str
    url: str  # base URL, e.g. http://127.0.0.1:8001 (no /v1 suffix)
    model: str = "default"  # model version served; part of the route key
    pool: str = "default"  # e.g. "default" or "economy"
    engine_type: str = "vllm"  # vllm | sglang | tgi | llamacpp | sim
    kv_capacity_tokens: int | None = None  # from config when the engine does not report it


@dataclass(slots=True)
class NodeReport:
    """One normalised observation of an engine (from a scrape or a sidecar)."""

    node_id: str
    timestamp: float  # clock time the report was taken
    running: float = 0.0  # requests running
    waiting: float = 0.0  # requests waiting in the engine queue
    kv_usage: float = 0.0  # fraction of KV cache in use, 0..1
    kv_capacity_tokens: int | None = None
    prefix_hit_rate: float | None = None  # token hit rate over the last window, 0..1
    prompt_tokens_rate: float = 0.0  # tokens/s
    generation_tokens_rate: float = 0.0  # tokens/s
    preemptions_total: float = 0.0
    process_start_time: float | None = None
    counters_reset: bool = False  # a counter went backwards: the engine restarted
    stale: bool = False  # the scrape failed or could not be parsed
    engine_type: str = "vllm"
    state_hint: NodeState | None = None  # what a sidecar asks for (backoff, quiescing)
    url: str | None = None
    model: str | None = None
    extra: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> str:
        d = asdict(self)
        d["state_hint"] = self.state_hint.value if self.state_hint else None
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> NodeReport:
        d: dict[str, Any] = json.loads(text)
        hint = d.get("state_hint")
        d["state_hint"] = NodeState(hint) if hint else None
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass(frozen=True, slots=True)
class RoutePin:
    """The one node a request must go to: it holds the state the request continues (a
    stored response), with ``cached_tokens`` of that state expected in its prefix cache."""

    node_id: str
    cached_tokens: int = 0


@dataclass(slots=True)
class RouteRequest:
    """What the router needs to know about one request (no prompt text kept)."""

    request_id: str
    model: str
    prompt_tokens: int
    block_hashes: list[int]  # chained full-block hashes of the canonical prompt
    route_key: str  # model version + digest of the stable prefix
    max_tokens: int = 256
    tenant: str = "default"
    priority: int = 0
    pool: str | None = None  # restrict to a node pool (degrade path)
    # The prompt's block hashes as its engine computes them (model tokenizer and chat
    # template, vLLM hash), per KV block size, when configured; None: the engine hashes
    # with kvgate's text model (block_hashes).
    engine_block_hashes: dict[int, list[int]] | None = None
    engine_prompt_tokens: int | None = None
    # what the request asks of the engine (kvgate.routing.endpoints): "generate" (chat,
    # completions: cache-affine routing) or a non-generation kind such as "embeddings"
    # (least load, served only by nodes whose engine type serves it)
    endpoint: str = "generate"
    pin: RoutePin | None = None  # routed to this node or to none (no other node has the state)

    @property
    def total_tokens_estimate(self) -> int:
        return self.prompt_tokens + self.max_tokens


@dataclass(frozen=True, slots=True)
class RouteDecision:
    node_id: str
    reason: str  # e.g. "prefix_match", "home_set", "least_load_miss", "round_robin"
    expected_cached_tokens: int
    policy: str
    candidates: tuple[str, ...] = ()


class NoNodeAvailable(RuntimeError):
    """No node can take the request (all unreachable, quiescing, or excluded)."""


class AdmissionKind(StrEnum):
    ADMIT = "admit"
    QUEUE = "queue"  # only an intermediate state; a queued request ends admitted or timed out
    REJECT = "reject"
    DEGRADE = "degrade"


class RejectReason(StrEnum):
    """Why a request was refused; the gateway maps each to an HTTP answer."""

    TOO_LARGE = "too_large"  # needs more than its tenant may ever hold
    QUEUE_FULL = "queue_full"  # over quota and the tenant's queue is full
    DEADLINE = "deadline"  # waited in the queue past its deadline
    STORE_UNAVAILABLE = "store_unavailable"  # fail-closed while the shared store is down
    OVERLOADED = "overloaded"  # waited its class's limit in a standing queue (engines saturated)


@dataclass(slots=True)
class AdmissionRequest:
    request_id: str
    tenant: str
    priority_class: str  # e.g. "interactive" | "batch"; already checked against the key
    prompt_tokens: int
    max_tokens: int | None  # the client's output bound; None: the model's default applies
    wants_async: bool = False  # client sent Prefer: respond-async
    model: str = ""
    stream: bool = False  # reports its first token as it streams (times the quota loop)


@dataclass(slots=True)
class AdmissionResult:
    """A typed decision; it carries no HTTP status or header text (see gateway.admission_http)."""

    kind: AdmissionKind
    reason: str  # a store reason (within_guarantee, elastic, tenant_cap ...) or a RejectReason
    queued_seconds: float = 0.0
    reserved_tokens: int = 0
    output_bound: int = 0  # output tokens the reservation covers (prompt + this = reserved)
    retry_after_s: float | None = None  # for rejections: when capacity is expected back
    degrade_to: str | None = None  # "low_priority" | "async" | "economy_pool"
    ticket: Any = None  # the core's handle, passed back to progress()/release()
