"""Prometheus metrics of the admission layer (on a caller-supplied registry)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class AdmissionMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else CollectorRegistry()
        self.registry = r
        self.decisions = Counter(
            "kvgate_admission_decisions",
            "Admission decisions by tenant, decision and reason",
            ["tenant", "decision", "reason"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "kvgate_admission_queue_depth", "Requests waiting in the queue", ["tenant"], registry=r
        )
        self.queue_wait = Histogram(
            "kvgate_admission_queue_wait_seconds",
            "Time queued requests waited before admission or timeout",
            ["tenant", "outcome"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60),
            registry=r,
        )
        self.quota_total = Gauge(
            "kvgate_quota_total_tokens", "Cluster total quota (runtime tokens)", registry=r
        )
        self.quota_used = Gauge(
            "kvgate_quota_used_tokens",
            "Runtime tokens reserved, all gateways",
            ["tenant"],
            registry=r,
        )
        self.quota_guaranteed = Gauge(
            "kvgate_quota_guaranteed_tokens", "Guaranteed quota per tenant", ["tenant"], registry=r
        )
        self.watermark = Gauge(
            "kvgate_quota_watermark_tokens",
            "max(ledger runtime tokens, engine-reported KV tokens)",
            registry=r,
        )
        self.store_up = Gauge(
            "kvgate_store_up", "1 when the shared store answers, 0 on local fallback", registry=r
        )
        self.release_rate = Gauge(
            "kvgate_admission_release_rate_tokens_per_second",
            "Measured release rate (drives Retry-After)",
            registry=r,
        )
        self.reclaimed = Counter(
            "kvgate_admission_reclaimed_tokens",
            "Tokens returned from gateways whose lease expired",
            registry=r,
        )
        self.dynamic_adjustments = Counter(
            "kvgate_dynamic_quota_adjustments",
            "Dynamic total-quota steps by direction",
            ["direction"],
            registry=r,
        )
        self.overcommit_ratio = Gauge(
            "kvgate_admission_overcommit_ratio",
            "Effective over-admission ratio (reservations may reach total x ratio)",
            registry=r,
        )
        self.overcommit_excess = Gauge(
            "kvgate_admission_overcommit_excess_tokens",
            "Reserved runtime tokens above the total (over-admitted)",
            registry=r,
        )
        self.overcommit_paused = Counter(
            "kvgate_admission_overcommit_paused",
            "Times engine KV use reached the total and over-admission was paused",
            registry=r,
        )
        self.bound_overrun = Counter(
            "kvgate_admission_bound_overrun_tokens",
            "Output tokens generated beyond the reserved output bound",
            ["tenant"],
            registry=r,
        )
        self.reserved = Gauge(
            "kvgate_admission_reserved_tokens",
            "Runtime tokens reserved by this gateway, by tenant and dispatch mode",
            ["tenant", "mode"],
            registry=r,
        )
        self.quota_pressure = Gauge(
            "kvgate_dynamic_quota_pressure",
            "The quota loop's pressure (1.0 = at the KV watermark or the TTFT target)",
            registry=r,
        )
        self.quota_leader = Gauge(
            "kvgate_dynamic_quota_leader",
            "1 while this replica leads the dynamic quota loop, 0 while it follows",
            registry=r,
        )
        self.quota_sharing = Gauge(
            "kvgate_dynamic_quota_sharing_ratio",
            "Reserved (kind=reserved) or held (kind=held) runtime tokens per engine-reported "
            "KV token: how much a shared prefix is counted more than once (1.0 = not at all)",
            ["kind"],
            registry=r,
        )
        self.guarantee_claims = Counter(
            "kvgate_admission_guarantee_claims",
            "Requests that fit their tenant's unused guarantee: honoured at once or refused",
            ["tenant", "outcome"],
            registry=r,
        )
        self.prefill_limit = Gauge(
            "kvgate_admission_prefill_limit_tokens",
            "Prefill gate: pending-prefill limit (prompt tokens awaiting a first token)",
            registry=r,
        )
        self.prefill_pending = Gauge(
            "kvgate_admission_prefill_pending_tokens",
            "Prompt tokens of admitted streams still waiting for their first token",
            registry=r,
        )
        self.prefill_held = Counter(
            "kvgate_admission_prefill_held",
            "Admissions the prefill gate held back (queued) by priority class",
            ["priority_class"],
            registry=r,
        )
        self.held_with_headroom = Counter(
            "kvgate_admission_held_with_headroom",
            "Admissions a limit would have held back while every eligible engine had "
            "headroom (admitted instead: fail-open), by the limit",
            ["reason"],
            registry=r,
        )
        self.shrink_skipped = Counter(
            "kvgate_admission_shrink_skipped_with_headroom",
            "Limit reductions not made because every eligible engine had headroom, by limit",
            ["limit"],
            registry=r,
        )
        self.store_up.set(1)
