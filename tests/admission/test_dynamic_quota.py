"""The dynamic total quota: the rule on a model plant, leader and followers, bounds, forecast."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from kvgate.admission.config import AdmissionConfig
from kvgate.admission.core import AdmissionCore
from kvgate.admission.dynamic_quota import LEADER_KEY, DynamicQuota
from kvgate.admission.metrics import AdmissionMetrics
from kvgate.admission.quota_rule import Observation, QuotaRule
from kvgate.clock import ManualClock, run_now
from kvgate.flags import Flags
from kvgate.store.keys import TOTAL_QUOTA, WATERMARK
from kvgate.store.memory import MemoryStore
from tests.admission.helpers import admit, make_core, release, request


def test_interval_is_validated_to_20_30_seconds() -> None:
    with pytest.raises(ValidationError, match=r"dynamic_quota\.interval_s"):
        AdmissionConfig(dynamic_quota={"interval_s": 5})
    assert AdmissionConfig().dynamic_quota.interval_s == 25


def plant(total: int, knee: int) -> Observation:
    """Latency in proportion to the total up to the knee (at the target there), a cliff
    above it; KV use proportional to the total, well under the watermarks."""
    ttft = total / knee if total <= knee else 1.0 + 8 * (total / knee - 1)
    return Observation(total, kv_ratio=0.3 * total / knee, ttft_ratio=ttft, demand=True)


def trajectory(start: int, knee: int, periods: int, rule: QuotaRule) -> list[int]:
    totals = [start]
    for _ in range(periods):
        totals.append(rule.next_total(plant(totals[-1], knee)).total)
    return totals


def new_rule() -> QuotaRule:
    return QuotaRule(tighten_above=0.8, relax_below=0.5, max_step=4.0)


def settled_after(totals: list[int], knee: int) -> int:
    """Periods until the total enters ±10% of the knee and stays there."""
    return next(
        i for i in range(len(totals)) if all(0.9 * knee <= x <= 1.1 * knee for x in totals[i:])
    )


@pytest.mark.parametrize("start", [30_000, 300_000])
def test_reaches_the_knee_within_two_periods_from_far_below_or_above(start: int) -> None:
    totals = trajectory(start, 100_000, 16, new_rule())
    assert settled_after(totals, 100_000) <= 2, totals
    assert max(totals[2:]) <= 100_000, totals  # holds below the cliff once there


@pytest.mark.parametrize("factor", [0.3, 3.0])
def test_follows_a_step_change_in_capacity_within_two_periods(factor: float) -> None:
    """Settled at a knee of 100k, capacity changes so the total is factor × the new knee."""
    rule = new_rule()
    totals = trajectory(30_000, 100_000, 8, rule)
    knee = int(totals[-1] / factor)
    after = [totals[-1]]
    for _ in range(8):
        after.append(rule.next_total(plant(after[-1], knee)).total)
    assert settled_after(after, knee) <= 2, (knee, after)


def test_a_breach_cuts_at_once_but_not_below_what_was_fine() -> None:
    rule = new_rule()
    rule.next_total(plant(80_000, 100_000))  # fine at 80k
    move = rule.breach(150_000, ttft_ratio=5.0)
    assert (move.direction, move.total) == ("breach", 105_000)  # × 0.7
    assert rule.breach(100_000, ttft_ratio=5.0).total == 80_000  # the fine floor


def test_a_re_probe_after_forgetting_stays_below_the_old_knee_near_the_limit() -> None:
    """Holding a band below a too-much total; once that mark expires the rule may probe
    again, but while latency is near the target not past the old mark / precision (the
    ±10% band); with clear headroom (capacity grew) it climbs step by step."""
    rule = QuotaRule(tighten_above=0.8, relax_below=0.5, max_step=4.0, memory=3)
    rule.next_total(Observation(100_000, kv_ratio=0.3, ttft_ratio=3.0, demand=True))
    near = [rule.next_total(Observation(90_909, 0.3, 0.85, True)).total for _ in range(6)]
    assert rule.forgot_high == 100_000  # the mark expired on the way
    assert near == [90_909] * 6
    roomy = [rule.next_total(Observation(90_909, 0.3, 0.5, True)).total]
    assert roomy == [99_999]  # × precision


def test_a_raise_toward_a_known_too_much_total_aims_a_band_below_it() -> None:
    """Fine at 30k with latency at 30% of target, 100k known too much: the proportional
    estimate (3.2×) is kept a band below the too-much total (100k / 1.1), not halved
    geometrically toward it."""
    rule = new_rule()
    rule.next_total(Observation(100_000, kv_ratio=0.3, ttft_ratio=3.0, demand=True))
    move = rule.next_total(Observation(30_000, kv_ratio=0.1, ttft_ratio=0.3, demand=True))
    assert (move.direction, move.total) == ("relax", 90_909)


def test_holds_without_unmet_demand_and_tightens_on_kv_alone() -> None:
    rule = new_rule()
    idle = Observation(1000, kv_ratio=0.1, ttft_ratio=0.2, demand=False)
    assert rule.next_total(idle).direction == "hold"
    full = Observation(1000, kv_ratio=1.3, ttft_ratio=None, demand=True)
    move = rule.next_total(full)
    assert move.direction == "tighten" and move.total == 500  # to the 65% middle
    assert move.pressure == pytest.approx(1.3 / 0.8)


def core_on(store: MemoryStore, name: str, **config: object) -> AdmissionCore:
    return AdmissionCore(
        AdmissionConfig(**config),  # type: ignore[arg-type]
        store,
        flags=Flags(),
        gateway_id=name,
        metrics=AdmissionMetrics(CollectorRegistry()),
    )


def test_one_leader_publishes_and_the_others_follow() -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    config = {"total_quota": 10_000, "queue": {"max_queue_tokens": 10**6}}
    a, b = core_on(store, "gw-a", **config), core_on(store, "gw-b", **config)
    loop_a = DynamicQuota(a, store, capacity=lambda: 100_000)
    loop_b = DynamicQuota(b, store, capacity=lambda: 100_000)
    for r in [run_now(a.try_admit(request(prompt=5000, max_tokens=4000), 0.0)) for _ in range(2)]:
        assert r.kind.value in ("admit", "queue")  # demand: the second one waits
    first = run_now(loop_a.step(25.0))
    assert first.direction == "relax" and first.total > 10_000
    assert run_now(store.get(LEADER_KEY)) == "gw-a"
    assert run_now(store.get(TOTAL_QUOTA)) == str(first.total)
    follow = run_now(loop_b.step(25.0))
    assert (follow.direction, b.total) == ("follow", first.total)
    assert b.metrics.quota_leader._value.get() == 0
    clock.advance(3 * 25.0 + 1)  # the leader stops renewing: its lease runs out
    assert run_now(loop_b.step(clock.now())).direction != "follow"
    assert run_now(store.get(LEADER_KEY)) == "gw-b"


def test_bounds_hard_cap_guarantees_and_the_store_value() -> None:
    core, clock = make_core(
        total_quota=10_000,
        absolute_hard_cap=12_000,
        tenants=[{"name": "a", "guaranteed": 3000}],
        queue={"max_queue_tokens": 10**6},
    )
    used = [20_000]
    core.ledger.engine_usage = lambda: used[0]
    kv = [10_000]
    loop = DynamicQuota(core, core.store, capacity=lambda: kv[0])
    for _ in range(6):
        run_now(loop.step(clock.now()))
    assert core.total == 3000  # never below the guarantees
    assert run_now(core.store.get(WATERMARK)) == str(core.ledger.watermark())
    used[0] = 100
    admit(core, clock, request("a", 2000, 1000))
    admit(core, clock, request("a", 2000, 1000))  # queued: demand exists
    for _ in range(12):
        clock.advance(25)
        run_now(loop.step(clock.now()))
    assert 7_900 <= core.total <= 8000  # the tighten watermark (80%) of KV capacity
    kv[0] = 100_000
    for _ in range(4 * 5):  # ticks every check_s (5 s): period steps and the ramp between
        clock.advance(5)
        run_now(loop.tick(clock.now()))
    assert core.total == 12_000  # the absolute hard cap
    assert core.metrics.dynamic_adjustments.labels("relax")._value.get() > 0
    core.book.apply_store_value(TOTAL_QUOTA, "999999")
    assert core.total == 12_000


def test_a_forecast_pre_scales_unless_its_flag_is_off() -> None:
    core, clock = make_core(flags={"forecast": True}, total_quota=10_000)  # off by default
    loop = DynamicQuota(core, core.store, capacity=lambda: 1_000_000, forecast=lambda t: 50_000)
    step = run_now(loop.step(clock.now()))
    assert (step.direction, core.total) == ("forecast", 50_000)
    off, clock_off = make_core(flags={"forecast": False}, total_quota=10_000)
    loop_off = DynamicQuota(off, off.store, capacity=lambda: 1_000_000, forecast=lambda t: 50_000)
    assert run_now(loop_off.step(clock_off.now())).direction == "hold"
    assert off.total == 10_000


def test_first_tokens_are_timed_from_admission_and_judged_by_admission_time() -> None:
    core, clock = make_core(total_quota=100_000)
    clock.set(10.0)
    early = admit(core, clock, request(prompt=10, max_tokens=10))
    clock.set(20.0)
    late = admit(core, clock, request(prompt=10, max_tokens=10))
    run_now(core.progress(early, 1, 25.0))  # 15 s: admitted under the previous total
    run_now(core.progress(late, 1, 20.5))
    run_now(core.progress(late, 2, 21.0))  # only the first token counts
    assert core.first_tokens.quantile("interactive", 99, since=0.0) == (15.0, 2)
    assert core.first_tokens.quantile("interactive", 99, since=15.0) == (0.5, 1)


def test_streams_still_waiting_for_a_first_token_count_as_slow() -> None:
    core, clock = make_core(total_quota=100_000)
    quick = [admit(core, clock, request(prompt=10, max_tokens=10)) for _ in range(3)]
    stuck = request(prompt=10, max_tokens=10)
    stuck.stream = True
    admit(core, clock, stuck)
    silent = admit(core, clock, request(prompt=10, max_tokens=10))  # non-streamed: no report
    for r in quick:
        run_now(core.progress(r, 1, 0.2))
    pending = core.ledger.waiting_first_token("interactive")
    assert pending == [0.0]  # the stream only, not the silent non-streamed request
    p, n = core.first_tokens.quantile("interactive", 99, 0.0, now=9.0, pending=pending)
    assert (p, n) == (9.0, 4)
    release(core, clock, silent)


def test_a_real_overload_sim_converges_from_bad_starts() -> None:
    """kvgate sim --workload overload at 3× capacity (2 nodes), dynamic quota from 3× and
    0.3× of 650k — the best static total within the interactive SLO in the overload
    bench (docs/bench-results/admission.md). From either start the total in force is
    within ±10% of it from the end of period 2 on."""
    from kvgate.sim.cluster import ClusterSim, SimConfig
    from kvgate.workloads import generate_workload

    best, interval = 650_000, 25.0
    workload = generate_workload("overload", seed=0, requests=20_000, rate=96)
    for factor, since in ((3.0, 2 * interval), (0.3, 2 * interval)):
        config = SimConfig(
            nodes=2,
            admission=True,
            total_quota=int(factor * best),
            degrade_modes={"batch": "low_priority"},
        )
        summary = ClusterSim(workload, config, "hybrid").run().summary
        assert summary["lost"] == 0
        steps = [(at, total) for at, total, _, _ in summary["quota_steps"]]
        before = [total for at, total in steps if at <= since]
        in_force = before[-1:] + [total for at, total in steps if at > since]
        assert steps[-1][0] > since and in_force, steps
        assert all(0.9 * best <= t <= 1.1 * best for t in in_force), (factor, steps)
