from __future__ import annotations

import pytest

from kvgate.clock import ManualClock
from kvgate.routing import NodeView, RoutingConfig, UnknownNode
from kvgate.types import NodeReport, NodeSpec, NodeState


def make_view(**config: object) -> tuple[ManualClock, NodeView]:
    clock = ManualClock(50.0)
    view = NodeView(clock, RoutingConfig(**config))  # type: ignore[arg-type]
    view.add_node(NodeSpec("a", "http://a"))
    return clock, view


def report(clock: ManualClock, **fields: object) -> NodeReport:
    return NodeReport(node_id="a", timestamp=clock.now(), **fields)  # type: ignore[arg-type]


def test_unreachable_without_fresh_report_and_back() -> None:
    clock, view = make_view(freshness_s=15)
    assert view.state_of("a") == NodeState.HEALTHY  # grace period after being added
    clock.advance(16)
    assert view.state_of("a") == NodeState.UNREACHABLE
    view.apply_report(report(clock))
    assert view.state_of("a") == NodeState.HEALTHY
    clock.advance(10)
    view.apply_report(report(clock, stale=True))  # a failed scrape does not refresh
    clock.advance(6)
    assert view.state_of("a") == NodeState.UNREACHABLE
    assert view.get("a").state == NodeState.UNREACHABLE  # type: ignore[union-attr]


def test_explicit_unreachable_until_next_report() -> None:
    clock, view = make_view()
    view.set_state("a", NodeState.UNREACHABLE)
    assert view.state_of("a") == NodeState.UNREACHABLE
    view.apply_report(report(clock))
    assert view.state_of("a") == NodeState.HEALTHY


def test_restart_detected_by_process_start_time() -> None:
    clock, view = make_view(warmup_s=100)
    purged: list[str] = []
    view.subscribe(on_reregister=purged.append)
    view.apply_report(report(clock, process_start_time=1.0))
    clock.advance(60)
    assert view.cold_boost("a") == pytest.approx(0.4)
    view.apply_report(report(clock, process_start_time=2.0))
    assert purged == ["a"]
    assert view.state_of("a") == NodeState.REREGISTER
    assert view.cold_boost("a") == pytest.approx(1.0)  # boost restarts
    clock.advance(3)
    view.apply_report(report(clock, process_start_time=2.0))
    assert view.state_of("a") == NodeState.HEALTHY
    assert purged == ["a"]


def test_restart_detected_by_counter_reset() -> None:
    clock, view = make_view()
    purged: list[str] = []
    view.subscribe(on_reregister=purged.append)
    view.apply_report(report(clock, counters_reset=True, running=3))
    assert purged == ["a"] and view.state_of("a") == NodeState.REREGISTER


def test_cold_boost_decays_linearly_to_zero() -> None:
    clock, view = make_view(warmup_s=1800)
    assert view.cold_boost("a") == 1.0
    clock.advance(900)
    assert view.cold_boost("a") == pytest.approx(0.5)
    clock.advance(900)
    assert view.cold_boost("a") == 0.0


def test_state_hints_apply_and_revert() -> None:
    clock, view = make_view()
    view.apply_report(report(clock, state_hint=NodeState.BACKOFF))
    assert view.state_of("a") == NodeState.BACKOFF
    view.apply_report(report(clock, state_hint=NodeState.QUIESCING))
    assert view.state_of("a") == NodeState.QUIESCING
    view.set_state("a", NodeState.QUIESCING)  # the registry relaying the hint
    view.apply_report(report(clock))
    assert view.state_of("a") == NodeState.HEALTHY


def test_admin_state_is_sticky_over_hints() -> None:
    clock, view = make_view()
    view.set_state("a", "quiescing")
    view.apply_report(report(clock, state_hint=NodeState.BACKOFF))
    view.apply_report(report(clock))
    assert view.state_of("a") == NodeState.QUIESCING
    view.set_state("a", NodeState.HEALTHY)
    view.apply_report(report(clock, state_hint=NodeState.BACKOFF))
    assert view.state_of("a") == NodeState.BACKOFF


def test_admin_reregister_purges() -> None:
    _clock, view = make_view()
    purged: list[str] = []
    view.subscribe(on_reregister=purged.append)
    view.set_state("a", NodeState.REREGISTER)
    assert purged == ["a"] and view.state_of("a") == NodeState.REREGISTER


def test_ledger_raises_load_at_dispatch_before_next_report() -> None:
    clock, view = make_view(tokens_per_load_unit=1000, kv_usage_weight=0, waiting_weight=1)
    view.apply_report(report(clock, running=2))
    assert view.load("a") == pytest.approx(2.0)
    view.on_dispatch("a", "r1", 500)
    assert view.load("a") == pytest.approx(3.5)  # +1 request, +0.5 for 500 tokens
    view.on_progress("a", "r1", 500)
    assert view.get("a").inflight_tokens == 1000  # type: ignore[union-attr]
    view.on_complete("a", "r1")
    assert view.get("a").inflight_tokens == 0  # type: ignore[union-attr]
    view.apply_report(report(clock, running=2))  # the engine no longer shows it
    assert view.load("a") == pytest.approx(2.0)


def test_load_counts_queue_and_kv_usage() -> None:
    clock, view = make_view(waiting_weight=2, kv_usage_weight=4)
    view.apply_report(report(clock, running=1, waiting=2, kv_usage=0.5))
    assert view.load("a") == pytest.approx(1 + 2 + 2 + 2.0)


def test_add_remove_and_unknown_nodes() -> None:
    _clock, view = make_view()
    removed: list[str] = []
    view.subscribe(on_remove=removed.append)
    assert view.apply_report(NodeReport(node_id="ghost", timestamp=0)) is None
    view.add_node(NodeSpec("b", "http://b"))
    assert sorted(view.node_ids) == ["a", "b"]
    view.remove_node("b")
    assert removed == ["b"] and "b" not in view
    with pytest.raises(UnknownNode):
        view.set_state("b", NodeState.HEALTHY)
    with pytest.raises(ValueError):
        view.set_state("a", "sleeping")
