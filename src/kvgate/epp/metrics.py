"""The picker's own metrics (beside the gateway's, in the same registry)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_DECISION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 1, 5, 30, 120)


class EppMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.streams = Counter(
            "kvgate_epp_streams",
            "ext_proc streams from Envoy, by how they ended: completed (the answer went "
            "through), answered (the picker answered: an error or /v1/models), "
            "ended_early (the stream ended before the answer did: a client reset, an "
            "upstream reset, Envoy gone), cancelled (the gRPC call was cancelled or failed)",
            ["end"],
            registry=registry,
        )
        self.active = Gauge(
            "kvgate_epp_active_streams", "ext_proc streams open now", registry=registry
        )
        self.decision_seconds = Histogram(
            "kvgate_epp_decision_seconds",
            "From the end of the request body to the picker's answer (admission wait included)",
            buckets=_DECISION_BUCKETS,
            registry=registry,
        )
        self.upstream_failures = Counter(
            "kvgate_epp_upstream_failures",
            "Answers Envoy relayed that the pipeline counted as a failed attempt, by kind",
            ["kind"],
            registry=registry,
        )
