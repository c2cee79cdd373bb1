"""Policy precise: engine truth for synced nodes, the approximate index for the others."""

from __future__ import annotations

from kvgate.kv_events.index import PreciseIndex
from kvgate.kv_events.metrics import KvEventMetrics
from kvgate.kv_events.signal import PENDING_S, PreciseSignal, bind_signal
from kvgate.kv_events.wire import BlockRemoved, BlockStored, KVEventBatch
from tests.routing.conftest import Cluster, group_request


def _bound(cluster: Cluster) -> PreciseSignal:
    signal = PreciseSignal(PreciseIndex(), KvEventMetrics())
    bind_signal(cluster.nodes, signal)
    return signal


def _decisions(signal: PreciseSignal, state: str) -> float:
    v = signal.metrics.registry.get_sample_value(
        "kvgate_kv_events_decisions_total", {"state": state}
    )
    return v or 0.0


def test_routes_to_the_node_whose_engine_holds_the_prefix() -> None:
    c = Cluster(n=4, policy="precise")
    c.report_all(running=1)
    signal = _bound(c)
    req = group_request(1, "r1")
    for node in c.nodes.node_ids:
        signal.index.apply(node, KVEventBatch(0.0, []), 0.0)
    # The engine of n2 reports the group's prefix, though the gateway never sent it there.
    signal.index.apply("n2", KVEventBatch(0.0, [BlockStored(req.block_hashes[:32], None)]), 0.0)
    d = c.router.route(req)
    assert (d.node_id, d.reason, d.expected_cached_tokens) == ("n2", "precise_match", 32 * 16)
    assert _decisions(signal, "precise") == 1
    # Once the engine evicts it, the prediction follows at once (no TTL to wait out).
    signal.index.apply("n2", KVEventBatch(0.0, [BlockRemoved(req.block_hashes[8:32])]), 0.0)
    d = c.router.route(group_request(1, "r2"))
    assert d.node_id == "n2" and d.expected_cached_tokens == 8 * 16


def test_unsynced_nodes_fall_back_to_the_approximate_index() -> None:
    c = Cluster(n=2, policy="precise")
    c.report_all(running=0)
    signal = _bound(c)
    signal.index.apply("n0", KVEventBatch(0.0, []), 0.0)  # n0 synced and empty
    # n1 publishes nothing; the approximate index learns it served the group.
    first = group_request(3, "a")
    c.router.index.record("n1", first.block_hashes, c.clock.now())
    d = c.router.route(group_request(3, "b"))
    assert d.node_id == "n1" and d.reason == "cache_match"
    assert _decisions(signal, "mixed") == 1
    # The approximate index also lists n0, but n0's engine truth (empty) wins for n0.
    c.router.index.record("n0", first.block_hashes, c.clock.now())
    c.clock.advance(2 * PENDING_S)  # past the window a fresh dispatch stands in for events
    d = c.router.route(group_request(3, "c"))
    assert d.node_id == "n1"


def test_flag_off_uses_only_the_approximate_index() -> None:
    c = Cluster(n=2, policy="precise")
    c.report_all(running=0)
    signal = _bound(c)
    req = group_request(5, "x")
    signal.index.apply("n0", KVEventBatch(0.0, [BlockStored(req.block_hashes[:32], None)]), 0.0)
    signal.index.apply("n1", KVEventBatch(0.0, []), 0.0)
    c.router.index.record("n1", req.block_hashes, c.clock.now())
    c.clock.advance(2 * PENDING_S)
    assert c.router.route(req).node_id == "n0"
    c.flags.set("precise_events", False)
    d = c.router.route(req)
    assert d.node_id == "n1" and d.reason == "cache_match"
    assert _decisions(signal, "precise") == 1  # the flag-off decision is not counted


def test_without_a_bound_index_it_is_load_and_approximate_cache() -> None:
    c = Cluster(n=3, policy="precise")
    c.report("n0", running=5)
    c.report("n1", running=0)
    c.report("n2", running=5)
    d = c.router.route(group_request(9, "z"))
    assert (d.node_id, d.reason) == ("n1", "least_cost_miss")


def test_combined_signal_is_precise_where_synced_and_approximate_elsewhere() -> None:
    from kvgate.kv_events.signal import CombinedSignal
    from kvgate.routing.prefix_index import PrefixIndex

    precise, approx = PreciseIndex(), PrefixIndex()
    signal = CombinedSignal(precise, approx)
    chain = [1, 2, 3, 4]
    precise.apply("a", KVEventBatch(0.0, [BlockStored(chain[:1], None)]), 0.0)
    approx.record("a", chain, 0.0)  # the guess says a holds all 4: the events say 1
    approx.record("b", chain[:3], 0.0)  # b publishes nothing: the guess is all we have
    # within the pending window the gateway's own dispatch to a stands in for events not
    # yet arrived (its prefill is still running); after it, the engine's truth wins
    assert signal.match(chain, 0.0) == {"a": 4, "b": 3}
    later = 2 * PENDING_S
    assert signal.match(chain, later) == {"a": 1, "b": 3}
    assert signal.match(chain, later, ["b"]) == {"b": 3}
    assert signal.match(chain, later, ["a"]) == {"a": 1}
    # With an engine tokenizer the precise half is asked with the engine's own hashes.
    precise.apply("a", KVEventBatch(0.0, [BlockStored([91, 92], None)]), 0.0)
    with_engine = CombinedSignal(precise, approx, engine_block_hashes=[91, 92, 93])
    assert with_engine.match(chain, later) == {"a": 2, "b": 3}
