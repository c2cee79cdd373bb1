"""Prometheus metrics of the KV-event path (kvgate_kv_events_*, injectable registry)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class KvEventMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.batches = Counter(
            "kvgate_kv_events_batches_total", "Event batches applied", ["node"], registry=r
        )
        self.events = Counter(
            "kvgate_kv_events_events_total", "Events applied by type", ["node", "type"], registry=r
        )
        self.lag = Histogram(
            "kvgate_kv_events_lag_seconds",
            "Time from the engine stamping a batch to the index applying it",
            ["node"],
            buckets=LAG_BUCKETS,
            registry=r,
        )
        self.gaps = Counter(
            "kvgate_kv_events_gaps_total",
            "Sequence gaps seen (batches the subscriber missed)",
            ["node"],
            registry=r,
        )
        self.replays = Counter(
            "kvgate_kv_events_replays_total",
            "Replay requests by outcome (filled: the gap was recovered)",
            ["node", "outcome"],
            registry=r,
        )
        self.resyncs = Counter(
            "kvgate_kv_events_resyncs_total",
            "Times a node's precise state was dropped (restart, unfilled gap, re-register)",
            ["node", "reason"],
            registry=r,
        )
        self.decode_errors = Counter(
            "kvgate_kv_events_decode_errors_total",
            "Messages that were not valid event batches",
            ["node"],
            registry=r,
        )
        self.blocks = Gauge(
            "kvgate_kv_events_blocks", "Cached blocks the events say a node holds", ["node"],
            registry=r,
        )  # fmt: skip
        self.synced = Gauge(
            "kvgate_kv_events_synced",
            "1 while a node's precise state is complete (events flowing, no open gap)",
            ["node"],
            registry=r,
        )
        self.decisions = Counter(
            "kvgate_kv_events_decisions_total",
            "Routing decisions by the state they were made on: precise (every eligible node "
            "synced), mixed, or approximate",
            ["state"],
            registry=r,
        )
        self.unrendered = Counter(
            "kvgate_kv_events_unrendered_total",
            "Requests for a model with a tokenizer whose engine prompt the gateway could not "
            "reproduce (multimodal parts, a request template, malformed): routed approximately",
            registry=r,
        )
        self.block_size = Gauge(
            "kvgate_kv_events_block_size",
            "The KV block size (tokens) prompts are hashed at for a node",
            ["node"],
            registry=r,
        )
