"""The gateway's own Prometheus metrics (kvgate_ prefix), in an injected registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kvgate.metric_children import BoundChildren

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class GatewayMetrics(BoundChildren):
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        super().__init__()
        self.requests = Counter(
            "kvgate_requests",
            "Requests answered, by endpoint and HTTP status",
            ["endpoint", "status"],
            registry=registry,
        )
        self.request_duration = Histogram(
            "kvgate_request_duration_seconds",
            "Time from request arrival to the last byte",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.ttft = Histogram(
            "kvgate_time_to_first_token_seconds",
            "Time from request arrival to the first streamed token (or full body when not streamed)",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.inflight = Gauge(
            "kvgate_inflight_requests", "Requests inside the gateway now", registry=registry
        )
        self.prompt_tokens = Counter(
            "kvgate_prompt_tokens",
            "Prompt tokens reported by engines, by node",
            ["node"],
            registry=registry,
        )
        self.completion_tokens = Counter(
            "kvgate_completion_tokens",
            "Completion tokens reported by engines, by node",
            ["node"],
            registry=registry,
        )
        self.usage_injected = Counter(
            "kvgate_stream_usage_injected",
            "Streams where the gateway asked the engine for usage and stripped the extra chunk",
            registry=registry,
        )
        self.client_disconnects = Counter(
            "kvgate_client_disconnects",
            "Clients that went away before the response ended",
            registry=registry,
        )
        self.scrapes = Counter(
            "kvgate_scrapes",
            "Node scrapes, by node and result",
            ["node", "result"],
            registry=registry,
        )
        self.registry_events = Counter(
            "kvgate_registry_events",
            "Node registry changes seen in the store, by kind",
            ["kind"],
            registry=registry,
        )
        self.front_requests = Counter(
            "kvgate_front_lean_requests",
            "Generate requests the lean HTTP front answered itself (server.lean_front)",
            registry=registry,
        )
        self.front_handovers = Counter(
            "kvgate_front_handovers",
            "Connections the lean front passed to aiohttp's server (a request it does not take)",
            registry=registry,
        )
        self.async_jobs = Counter(
            "kvgate_async_jobs",
            "Async jobs (Prefer: respond-async / degrade), by final status",
            ["status"],
            registry=registry,
        )
