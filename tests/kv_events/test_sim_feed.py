"""KV events in virtual time: the simulated engines feed policy precise's index."""

from __future__ import annotations

from kvgate.sim.cluster import ClusterSim, SimConfig
from kvgate.sim.events import parse_event
from kvgate.workloads import generate_workload


def test_zero_delay_predictions_equal_engine_truth() -> None:
    # Low rate, no delay: the index holds each engine's cache at every routing decision,
    # so every per-request prediction is what the engine then reports.
    workload = generate_workload("shared-prefix", seed=1, requests=96, rate=2.0)
    sim = ClusterSim(workload, SimConfig(nodes=4, kv_event_delay_s=0.0), "precise")
    result = sim.run()
    assert sim.kv_feed is not None and sim.kv_feed.batches > 0
    expected = [r.expected_cached_tokens for r in result.records]
    actual = [r.cached_tokens for r in result.records]
    assert sum(actual) > 0
    assert expected == actual
    for node_id, engine in sim.engines.items():
        sim.kv_feed.deliver(sim.clock.now() + 1.0)
        assert sim.kv_feed.index.blocks_of(node_id) == set(engine.scheduler.kv.pool.cached)


def test_precise_predictions_track_truth_under_eviction() -> None:
    # tenant-prefix's private prefixes fill the KV caches: engines evict all the time.
    workload = generate_workload("tenant-prefix", seed=0, requests=300)
    config = SimConfig(nodes=4, kv_event_delay_s=0.05)
    precise = ClusterSim(workload, config, "precise").run().summary
    hybrid = ClusterSim(workload, config, "hybrid").run().summary
    assert abs(precise["predicted_hit_rate"] - precise["cache_hit_rate"]) < 0.02
    # hybrid's index is right here too (it records at dispatch); precise must never do
    # worse on the truth, and its prediction is at least as close to it
    assert precise["cache_hit_rate"] >= hybrid["cache_hit_rate"]
    precise_error = abs(precise["predicted_hit_rate"] - precise["cache_hit_rate"])
    assert precise_error <= abs(hybrid["predicted_hit_rate"] - hybrid["cache_hit_rate"]) + 1e-9


def test_a_flushed_and_a_rejoined_node_resync() -> None:
    workload = generate_workload("shared-prefix", seed=4, requests=200, rate=4.0)
    events = [parse_event("flush:10:node-1"), parse_event("fail:15:node-2"),
              parse_event("join:20:node-2")]  # fmt: skip
    sim = ClusterSim(workload, SimConfig(nodes=3, events=events, kv_event_delay_s=0.0), "precise")
    result = sim.run()
    assert result.summary["lost"] == 0
    assert sim.kv_feed is not None
    sim.kv_feed.deliver(sim.clock.now() + 1.0)
    for node_id, engine in sim.engines.items():
        assert sim.kv_feed.index.blocks_of(node_id) == set(engine.scheduler.kv.pool.cached)
