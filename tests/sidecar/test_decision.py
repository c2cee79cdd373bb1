"""The sidecar's state decisions in virtual time: saturation with hysteresis, restarts, drain."""

from __future__ import annotations

from typing import Any

import pytest

from kvgate.clock import ManualClock
from kvgate.sidecar.decision import NodeStateDecider, SaturationPolicy
from kvgate.types import NodeReport, NodeState

POLICY = SaturationPolicy(
    waiting_high=8,
    waiting_low=2,
    kv_high=0.95,
    kv_low=0.85,
    preemptions_high=1,
    recover_hold_s=10,
    reregister_hold_s=6,
    unreachable_after_s=6,
)


def step(d: NodeStateDecider, clock: ManualClock, dt: float = 3.0, **fields: Any) -> NodeState:
    """Advance ``dt`` and show the decider a report of node "n" with NodeReport's own
    ``fields`` (kv_usage 0.1 unless given)."""
    clock.advance(dt)
    fields = {"kv_usage": 0.1, **fields}
    return d.observe(NodeReport(node_id="n", timestamp=clock.now(), **fields))


def test_queue_enters_backoff_and_recovers_only_after_calm_hold() -> None:
    clock = ManualClock()
    d = NodeStateDecider(clock, POLICY)
    assert step(d, clock, waiting=3) is NodeState.HEALTHY
    assert step(d, clock, waiting=8) is NodeState.BACKOFF
    # Between the marks: stays in backoff however long (level hysteresis).
    for _ in range(10):
        assert step(d, clock, waiting=5) is NodeState.BACKOFF
    # Below the low mark, but calm must last recover_hold_s (time hysteresis).
    assert step(d, clock, waiting=1) is NodeState.BACKOFF  # calm since t
    assert step(d, clock, waiting=1) is NodeState.BACKOFF  # +3
    assert step(d, clock, waiting=1) is NodeState.BACKOFF  # +6
    assert step(d, clock, waiting=1) is NodeState.BACKOFF  # +9
    assert step(d, clock, waiting=1) is NodeState.HEALTHY  # +12 >= 10
    assert not d.saturated


def test_relapse_during_calm_restarts_the_hold() -> None:
    clock = ManualClock()
    d = NodeStateDecider(clock, POLICY)
    step(d, clock, waiting=20)
    step(d, clock, waiting=0)
    step(d, clock, waiting=0)
    assert step(d, clock, waiting=4) is NodeState.BACKOFF  # not calm: hold reset
    step(d, clock, waiting=0)
    step(d, clock, waiting=0)
    step(d, clock, waiting=0)
    assert step(d, clock, waiting=0) is NodeState.BACKOFF  # 9 s of calm
    assert step(d, clock, waiting=0) is NodeState.HEALTHY


def test_kv_usage_and_preemptions_saturate() -> None:
    clock = ManualClock()
    d = NodeStateDecider(clock, POLICY)
    assert step(d, clock, kv_usage=0.96) is NodeState.BACKOFF
    for _ in range(4):
        step(d, clock, kv_usage=0.9)  # above kv_low: never calm
    assert d.state is NodeState.BACKOFF
    for _ in range(5):
        step(d, clock, kv_usage=0.5)
    assert d.state is NodeState.HEALTHY

    d2 = NodeStateDecider(clock, POLICY)
    assert step(d2, clock, preemptions_total=10) is NodeState.HEALTHY  # first sight: a baseline
    assert step(d2, clock, preemptions_total=10) is NodeState.HEALTHY
    assert step(d2, clock, preemptions_total=12) is NodeState.BACKOFF  # rising
    for _ in range(5):
        step(d2, clock, preemptions_total=12)
    assert d2.state is NodeState.HEALTHY


def test_restart_reregisters_for_the_hold_then_healthy() -> None:
    clock = ManualClock()
    d = NodeStateDecider(clock, POLICY)
    step(d, clock, waiting=30)
    assert d.state is NodeState.BACKOFF
    assert step(d, clock, counters_reset=True) is NodeState.REREGISTER
    assert d.restarts == 1
    assert step(d, clock, dt=3) is NodeState.REREGISTER  # 3 s < 6 s hold
    assert step(d, clock, dt=3) is NodeState.HEALTHY  # saturation history cleared


def test_stale_scrapes_become_unreachable_after_grace() -> None:
    clock = ManualClock()
    d = NodeStateDecider(clock, POLICY)
    step(d, clock)
    assert step(d, clock, dt=3, stale=True) is NodeState.HEALTHY  # one miss: 3 s < 6 s
    assert step(d, clock, dt=3, stale=True) is NodeState.UNREACHABLE
    assert step(d, clock, dt=3) is NodeState.HEALTHY

    fresh = NodeStateDecider(clock, POLICY)  # never reached the engine at all
    assert step(fresh, clock, stale=True) is NodeState.UNREACHABLE


def test_drain_is_quiescing_until_nothing_runs_or_waits() -> None:
    clock = ManualClock()
    d = NodeStateDecider(clock, POLICY)
    step(d, clock, running=2, waiting=1)
    d.begin_drain()
    assert d.state is NodeState.QUIESCING and not d.drained
    assert step(d, clock, running=2, waiting=0) is NodeState.QUIESCING
    assert not d.drained
    assert step(d, clock, running=0, waiting=0, counters_reset=True) is NodeState.QUIESCING
    assert d.drained
    assert step(d, clock, stale=True) is NodeState.QUIESCING  # still quiescing…
    assert not d.drained  # …but a failed scrape proves nothing


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"waiting_low": 9, "waiting_high": 8}, "waiting_low"),
        ({"kv_low": 0.99, "kv_high": 0.9}, "kv_low"),
        ({"recover_hold_s": -1}, "recover_hold_s"),
        ({"waiting_high": -1, "waiting_low": -2}, "waiting_high"),
    ],
)
def test_policy_validation_names_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SaturationPolicy(**kwargs)
