"""Admission that never hurts: the headroom signal from the node view, the prefill gate
failing open, limits that do not shrink while the engines have room, quota holds that
raise the dynamic total, the shared-prefix ratio of the quota ceiling, the flag."""

from __future__ import annotations

import logging

import pytest

from kvgate.admission.config import AdmissionConfig, HeadroomConfig
from kvgate.admission.core import AdmissionCore
from kvgate.admission.dynamic_quota import DynamicQuota
from kvgate.admission.sharing import SharingRatio
from kvgate.clock import ManualClock, run_now
from kvgate.flags import Flags
from kvgate.pipeline.engine_usage import engines_have_headroom, headroom_signal
from kvgate.routing.config import RoutingConfig
from kvgate.routing.node_view import NodeView
from kvgate.store.memory import MemoryStore
from kvgate.types import AdmissionKind, AdmissionRequest, NodeReport, NodeSpec, NodeState
from tests.admission.helpers import request

GATE = {"initial_tokens": 1000, "min_tokens": 100, "adapt_s": 1.0, "min_samples": 2}


class Room:
    """A headroom signal the test sets."""

    def __init__(self, value: bool = True) -> None:
        self.value = value

    def __call__(self) -> bool:
        return self.value


def core_with(
    room: Room, flags: dict[str, bool] | None = None, **config: object
) -> tuple[AdmissionCore, ManualClock]:
    clock = ManualClock()
    store = MemoryStore(clock)
    cfg = AdmissionConfig(**{"total_quota": 100_000, "prefill_gate": GATE, **config})  # type: ignore[arg-type]
    core = AdmissionCore(cfg, store, flags=Flags(flags or {}), gateway_id="gw", headroom=room)
    run_now(store.set_guarantees(core.book.guarantees()))
    return core, clock


def streamed(prompt: int = 400, tenant: str = "default") -> AdmissionRequest:
    req = request(tenant, prompt=prompt, max_tokens=10)
    req.stream = True
    return req


def held(core: AdmissionCore, reason: str) -> float:
    return core.metrics.held_with_headroom.labels(reason)._value.get()


# -- the signal ---------------------------------------------------------------------------
def view_of(n: int) -> tuple[NodeView, ManualClock]:
    clock = ManualClock(100.0)
    view = NodeView(clock, RoutingConfig(freshness_s=15))
    for i in range(n):
        view.add_node(NodeSpec(f"n{i}", f"http://n{i}"))
    return view, clock


def report(view: NodeView, clock: ManualClock, node: str, **fields: float) -> None:
    view.apply_report(NodeReport(node_id=node, timestamp=clock.now(), **fields))  # type: ignore[arg-type]


def has_room(view: NodeView) -> bool:
    return engines_have_headroom(view, max_waiting=0, kv_usage_below=0.8, max_inflight_growth=2)


def test_every_eligible_engine_must_report_room() -> None:
    view, clock = view_of(3)
    assert not has_room(view)  # no reports yet
    for node in ("n0", "n1"):
        report(view, clock, node, waiting=0, kv_usage=0.3)
    assert not has_room(view)  # n2 has not reported
    report(view, clock, "n2", waiting=0, kv_usage=0.79)
    assert has_room(view)
    report(view, clock, "n1", waiting=3, kv_usage=0.3)
    assert not has_room(view)  # a queue on one engine


def test_full_kv_backoff_requests_beyond_the_report_and_stale_reports_mean_no_room() -> None:
    view, clock = view_of(2)
    for node in ("n0", "n1"):
        report(view, clock, node, waiting=0, kv_usage=0.2)
    assert has_room(view)
    view.set_state("n1", NodeState.BACKOFF)
    assert not has_room(view)  # backoff: the engine says it is overloaded
    view.set_state("n1", NodeState.QUIESCING)
    assert has_room(view)  # draining: not eligible, so it does not count
    for rid in ("a", "b", "c"):
        view.on_dispatch("n0", rid, 100)
    assert not has_room(view)  # 3 more in flight than its report counted (> 2): unknown
    view.on_complete("n0", "a")
    assert has_room(view)  # finished since: 2 more, within the bound
    report(view, clock, "n0", waiting=0, kv_usage=0.2, running=2)
    view.on_dispatch("n0", "d", 100)
    assert has_room(view)  # 3 in flight, 2 of them in the report
    view2, clock2 = view_of(1)
    report(view2, clock2, "n0", waiting=0, kv_usage=0.85)
    assert not has_room(view2)
    clock2.advance(20)
    view3, clock3 = view_of(1)
    report(view3, clock3, "n0", waiting=0, kv_usage=0.1)
    clock3.advance(20)  # past freshness_s: the node is unreachable, none is eligible
    assert not has_room(view3)


def test_the_config_thresholds_reach_the_signal() -> None:
    view, clock = view_of(1)
    report(view, clock, "n0", waiting=1, kv_usage=0.5)
    assert not headroom_signal(view, HeadroomConfig())()
    assert headroom_signal(view, HeadroomConfig(max_waiting=1))()
    assert not headroom_signal(view, HeadroomConfig(max_waiting=1, kv_usage_below=0.5))()


# -- the prefill gate ---------------------------------------------------------------------
def test_the_gate_fails_open_while_the_engines_have_room_and_counts_it() -> None:
    room = Room(True)
    core, clock = core_with(room)
    kinds = [run_now(core.try_admit(streamed(), clock.now())).kind for _ in range(4)]
    assert kinds == [AdmissionKind.ADMIT] * 4  # 1600 pending > the 1000 limit: opened
    assert held(core, "prefill_gate") == 2
    room.value = False
    result = run_now(core.try_admit(streamed(), clock.now()))
    assert result.kind is AdmissionKind.QUEUE and result.reason == "prefill_gate"
    assert held(core, "prefill_gate") == 2


def test_queued_work_is_admitted_by_the_drain_once_the_engines_have_room() -> None:
    room = Room(False)
    core, clock = core_with(room)
    results = [run_now(core.try_admit(streamed(), clock.now())) for _ in range(4)]
    assert [r.kind for r in results].count(AdmissionKind.QUEUE) == 2
    room.value = True
    admitted = run_now(core.drain(clock.now()))
    assert len(admitted) == 2 and not len(core.queue)


def test_flag_fail_open_off_keeps_the_gate_closed() -> None:
    core, clock = core_with(Room(True), flags={"fail_open": False})
    kinds = [run_now(core.try_admit(streamed(), clock.now())).kind for _ in range(4)]
    assert kinds == [AdmissionKind.ADMIT] * 2 + [AdmissionKind.QUEUE] * 2
    assert held(core, "prefill_gate") == 0


def slow_first_tokens(core: AdmissionCore, clock: ManualClock) -> None:
    """Streams whose first tokens take 3 s (target 0.4 s): the second round adapts."""
    for _ in range(2):
        results = [run_now(core.try_admit(streamed(100), clock.now())) for _ in range(2)]
        clock.advance(3.0)
        for r in results:
            run_now(core.progress(r, 1, clock.now()))


@pytest.mark.parametrize("engines_idle", [True, False])
def test_the_gate_does_not_shrink_while_the_engines_have_room(engines_idle: bool) -> None:
    core, clock = core_with(Room(engines_idle))
    slow_first_tokens(core, clock)
    skipped = core.metrics.shrink_skipped.labels("prefill_gate")._value.get()
    if engines_idle:
        assert core.gate.limit == 1000 and skipped == 1
    else:
        assert core.gate.limit == 500 and skipped == 0  # halved (max_growth 2)


def test_a_shrunk_gate_goes_back_to_its_initial_limit_once_the_engines_are_idle() -> None:
    room = Room(False)
    core, clock = core_with(room)
    slow_first_tokens(core, clock)
    assert core.gate.limit == 500
    room.value = True
    clock.advance(1.0)
    results = [run_now(core.try_admit(streamed(100), clock.now())) for _ in range(2)]
    clock.advance(0.1)  # quick first tokens: nothing held, so no growth by latency
    for r in results:
        run_now(core.progress(r, 1, clock.now()))
    assert core.gate.limit == 1000


def test_one_warning_per_episode(caplog: pytest.LogCaptureFixture) -> None:
    room = Room(True)
    core, clock = core_with(room, headroom={"episode_gap_s": 10.0})
    with caplog.at_level(logging.WARNING, logger="kvgate.admission.headroom"):
        for _ in range(6):
            run_now(core.try_admit(streamed(), clock.now()))
            clock.advance(1.0)
        assert len(caplog.records) == 1
        room.value = False  # the engines got busy: the episode ends
        run_now(core.try_admit(streamed(), clock.now()))
        room.value = True
        run_now(core.try_admit(streamed(), clock.now()))
        assert len(caplog.records) == 2
        clock.advance(11.0)  # a long quiet gap: a new episode
        run_now(core.try_admit(streamed(), clock.now()))
        assert len(caplog.records) == 3
    assert "fail_open=off" in caplog.records[0].getMessage()


# -- the quota ----------------------------------------------------------------------------
def test_a_quota_hold_with_room_is_counted_and_the_dynamic_total_rises() -> None:
    room = Room(True)
    core, clock = core_with(room, total_quota=2000, flags={"prefill_gate": False})
    store = core.store
    dq = DynamicQuota(core, store)
    run_now(dq.tick(clock.now()))  # starts the first period
    first = run_now(core.try_admit(request(prompt=900, max_tokens=100), clock.now()))
    second = run_now(core.try_admit(request(prompt=900, max_tokens=600), clock.now()))
    assert first.kind is AdmissionKind.ADMIT
    assert second.kind is AdmissionKind.QUEUE  # the configured total is not overruled
    assert held(core, "quota_total") == 1
    clock.advance(5.0)
    step = run_now(dq.tick(clock.now()))
    assert step is not None and step.direction == "headroom"
    assert core.total == 2000 * core.config.dynamic_quota.max_step
    assert len(run_now(core.drain(clock.now()))) == 1


def test_no_quota_raise_without_room() -> None:
    core, clock = core_with(Room(False), total_quota=2000, flags={"prefill_gate": False})
    dq = DynamicQuota(core, core.store)
    run_now(dq.tick(clock.now()))
    run_now(core.try_admit(request(prompt=900, max_tokens=100), clock.now()))
    assert run_now(core.try_admit(request(prompt=900, max_tokens=600), clock.now())).kind is (
        AdmissionKind.QUEUE
    )
    assert held(core, "quota_total") == 0
    clock.advance(5.0)
    assert run_now(dq.tick(clock.now())) is None and core.total == 2000


def test_a_breach_does_not_cut_the_total_while_the_engines_have_room() -> None:
    room = Room(True)
    core, clock = core_with(room, total_quota=50_000, flags={"prefill_gate": False})
    dq = DynamicQuota(core, core.store)
    run_now(dq.tick(clock.now()))
    results = [run_now(core.try_admit(streamed(100), clock.now())) for _ in range(20)]
    clock.advance(4.0)  # 4 s first tokens against a 0.75 s target: a breach
    for r in results:
        run_now(core.progress(r, 1, clock.now()))
    clock.advance(1.0)
    assert run_now(dq.tick(clock.now())) is None and core.total == 50_000
    assert core.metrics.shrink_skipped.labels("dynamic_quota")._value.get() == 1
    room.value = False
    for r in [run_now(core.try_admit(streamed(100), clock.now())) for _ in range(20)]:
        clock.advance(0.2)
        run_now(core.progress(r, 1, clock.now() + 4.0))
    clock.advance(5.0)
    step = run_now(dq.tick(clock.now()))
    assert step is not None and step.direction == "breach" and core.total < 50_000


# -- a shared prefix counted once -----------------------------------------------------------
def test_the_sharing_ratio_is_measured_smoothed_and_bounded() -> None:
    ratio = SharingRatio()
    ratio.observe(reserved=10_000, held=8_000, engine_tokens=500)  # too little to compare
    assert ratio.reserved_per_engine_token == 1.0
    ratio.observe(reserved=40_000, held=20_000, engine_tokens=10_000)
    assert (ratio.reserved_per_engine_token, ratio.held_per_engine_token) == (4.0, 2.0)
    ratio.observe(reserved=10_000, held=10_000, engine_tokens=10_000)
    assert ratio.reserved_per_engine_token == pytest.approx(4.0 + 0.3 * (1.0 - 4.0))
    ratio.observe(reserved=10**9, held=10**9, engine_tokens=10_000)
    assert ratio.reserved_per_engine_token <= 16.0
    ratio.observe(reserved=100, held=100, engine_tokens=10_000)  # never below 1
    assert ratio.held_per_engine_token >= 1.0


def test_the_quota_ceiling_counts_a_shared_prefix_once_while_first_tokens_are_fast() -> None:
    core, clock = core_with(Room(False), total_quota=1_000_000, flags={"prefill_gate": False})
    dq = DynamicQuota(core, core.store, capacity=lambda: 100_000)
    _, ceiling = dq._bounds(100_000)
    assert ceiling == 80_000  # tighten_above x KV capacity
    dq.sharing.observe(reserved=300_000, held=200_000, engine_tokens=50_000)
    assert dq._bounds(100_000)[1] == 80_000  # latency not yet seen to meet its target
    run_now(dq.tick(clock.now()))
    results = [run_now(core.try_admit(streamed(100), clock.now())) for _ in range(20)]
    clock.advance(0.1)
    for r in results:
        run_now(core.progress(r, 1, clock.now()))
    clock.advance(5.0)
    run_now(dq.check(clock.now()))  # fast first tokens: the engines are not the bottleneck
    assert dq._bounds(100_000)[1] == 320_000  # the engines hold 1/4 of what is held
