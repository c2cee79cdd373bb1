"""Holt-Winters, the minute recorder, the demand ratio and the quota provider."""

from __future__ import annotations

import math

import pytest

from kvgate.clock import run_now
from kvgate.flags import Flags
from kvgate.forecast import DemandForecast, HoltWinters, MinuteRecorder, forecast_capacity
from kvgate.forecast.samples import SAMPLES_PREFIX, MinuteSample
from kvgate.sim.cluster import ClusterSim, SimConfig
from kvgate.workloads import generate_workload


def daily(i: int, period: int = 24) -> float:
    return 100.0 + 60.0 * math.sin(2 * math.pi * i / period)


def test_holt_winters_learns_a_season_and_explains_itself() -> None:
    hw = HoltWinters(24)
    for i in range(24):
        hw.update(daily(i))
    assert hw.seasonal
    for i in range(24, 24 * 4):
        hw.update(daily(i))
    for h in (1, 6, 12):
        want = daily(24 * 4 - 1 + h)
        assert hw.forecast(h) == pytest.approx(want, rel=0.05)
        e = hw.explain(h)
        assert e.value == pytest.approx(e.level + h * e.trend + e.seasonal)
    with pytest.raises(ValueError, match="period"):
        HoltWinters(1)
    with pytest.raises(ValueError, match="alpha"):
        HoltWinters(24, alpha=0)


def test_before_a_season_it_follows_the_level_without_a_seasonal_term() -> None:
    hw = HoltWinters(100)
    for _ in range(10):
        hw.update(50.0)
    assert not hw.seasonal and hw.explain(3).seasonal == 0.0
    assert hw.forecast(3) == pytest.approx(50.0)


def test_recorder_closes_minutes_with_gaps_sizes_and_hit_rate() -> None:
    rec = MinuteRecorder(60.0)
    rec.observe_arrival(1.0, "a", "interactive", 100, 10)
    rec.observe_arrival(2.0, "b", "batch", 300, 30)
    rec.observe_hit(3.0, 400, 100)
    rec.observe_arrival(200.0, "a", "interactive", 50, 5)  # minute 3; 1 and 2 were quiet
    rec.observe_hit(100.0, 10, 10)  # late: counted in the open minute (3)
    samples = rec.close(200.0)
    assert [s.minute for s in samples] == [0, 1, 2]
    first = samples[0]
    assert (first.arrivals, first.by_tenant, first.by_class) == (
        2,
        {"a": 1, "b": 1},
        {"interactive": 1, "batch": 1},
    )
    assert (first.tokens, first.prompt_p90, first.hit_rate) == (440, 300.0, 0.25)
    assert samples[1].arrivals == 0 and samples[1].hit_rate is None
    assert MinuteSample.from_json(first.to_json()) == first
    assert rec.close(230.0) == []  # minute 3 is still open
    (third,) = rec.close(245.0)
    assert (third.minute, third.hit_rate) == (3, 1.0)


def feed(f: DemandForecast, minutes: int, rate: callable) -> None:  # type: ignore[valid-type]
    for m in range(minutes):
        for k in range(int(rate(m))):
            f.observe_arrival(m * 60.0 + k * 0.01, "t", "interactive", 90, 10)
    f.update(minutes * 60.0)


def test_demand_ratio_sees_a_rise_and_a_fall_coming() -> None:
    period = 24
    f = DemandForecast(interval_s=60.0, season_minutes=period, horizon_minutes=4)
    assert f.demand_ratio(0.0) is None  # nothing known
    feed(f, period * 3 + 3, lambda m: daily(m, period) / 10)  # just before the rise peaks
    rising = f.demand_ratio((period * 3 + 3) * 60.0)
    assert rising is not None and rising > 1.0
    g = DemandForecast(interval_s=60.0, season_minutes=period, horizon_minutes=4)
    feed(g, period * 3 + 8, lambda m: daily(m, period) / 10)  # on the way down
    falling = g.demand_ratio((period * 3 + 8) * 60.0)
    assert falling is not None and falling < 1.0
    assert f.score.mape is not None and f.score.mape < 15.0


def test_the_provider_changes_capacity_only_with_the_flag_on() -> None:
    period = 24
    f = DemandForecast(interval_s=60.0, season_minutes=period, horizon_minutes=4)
    feed(f, period * 3 + 3, lambda m: daily(m, period) / 10)
    now = (period * 3 + 3) * 60.0
    flags = Flags()
    assert flags["forecast"] is False  # off by default
    seen = forecast_capacity(lambda: 10_000, f, flags, lambda: now, lambda: 1)
    assert seen() == 10_000
    flags.set("forecast", True)
    ratio = f.demand_ratio(now)
    assert ratio is not None
    assert seen() == int(10_000 * ratio)  # raise: ahead of the rise
    f.mode = "track"
    assert seen() == int(10_000 / ratio)
    f.mode = "hold"
    assert seen() == 10_000  # hold acts only on a fall
    none = DemandForecast(interval_s=60.0, season_minutes=period)
    assert forecast_capacity(lambda: None, none, flags, lambda: now, lambda: 777)() is None


def test_the_simulator_records_samples_and_scores_the_forecast() -> None:
    w = generate_workload("daily", days=2, day_s=1200.0, peak_rate=1.0, sample_s=60.0)
    results, errors = {}, {}
    for on in (False, True):
        config = SimConfig(nodes=1, kv_blocks=128, admission=True, flags={"forecast": on})
        sim = ClusterSim(w, config, "hybrid")
        result = sim.run()
        assert sim.forecast is not None and sim.admission is not None
        stored = run_now(sim.admission.store.get_prefix(SAMPLES_PREFIX))
        assert len(stored) >= 38  # 40 minutes of 2 days, every closed minute kept
        assert sum(MinuteSample.from_json(v).arrivals for v in stored.values()) <= len(w.items)
        results[on] = result.summary
        errors[on] = sim.forecast.score.abs_pct_errors
    for s in results.values():
        assert s["forecast_mape_pct"] is not None and s["forecast_scored_samples"] > 5
    # same stream, same forecast (the run with the flag closes its last minute sooner, as
    # the quota loop asks for the forecast); only the quota it drives differs
    n = min(len(errors[False]), len(errors[True]))
    assert n > 5 and errors[False][:n] == errors[True][:n]
    assert results[False]["quota_adjustments"] != results[True]["quota_adjustments"]


def test_tokens_needed_scales_what_is_in_flight_by_the_forecast_growth() -> None:
    from kvgate.forecast.provider import tokens_needed

    period = 24
    f = DemandForecast(interval_s=60.0, season_minutes=period, horizon_minutes=4)
    now = (period * 3 + 3) * 60.0
    empty = DemandForecast(interval_s=60.0, season_minutes=period, horizon_minutes=4)
    assert tokens_needed(empty, lambda: 1000.0, lambda: now)(now + 120) is None  # no season
    needed = tokens_needed(f, lambda: 1000.0, lambda: now)
    feed(f, period * 3 + 3, lambda m: daily(m, period) / 10)
    value = needed(now + 120)
    assert value is not None and 1000.0 < value <= 2000.0  # a rise is coming


def test_the_gateway_observes_arrivals_through_the_pipeline_once() -> None:
    """One observer (on ``RequestPipeline.admit``) for both drivers: the gateway's admission
    controller is not wrapped, and one admitted request is one arrival sample."""
    import asyncio

    from kvgate.clock import ManualClock
    from kvgate.gateway.app import GATEWAY, create_app
    from kvgate.gateway.config import GatewayConfig
    from kvgate.routing import route_request_from_tokens
    from kvgate.types import AdmissionRequest

    clock = ManualClock(30.0)
    gateway = create_app(GatewayConfig(), clock=clock)[GATEWAY]
    assert gateway.forecast is not None
    assert len(gateway.pipeline.arrival_observers) == 1
    assert "admit" not in vars(gateway.admission)  # no second observer around admission
    route = route_request_from_tokens(
        request_id="r1", model="default", prompt_tokens=100, block_hashes=[], route_key="k"
    )
    flow = gateway.pipeline.start(route, AdmissionRequest("r1", "default", "interactive", 100, 20))
    asyncio.run(gateway.pipeline.admit(flow))
    samples: list[MinuteSample] = []
    gateway.forecast.sink = samples.append
    clock.advance(60.0)
    gateway.forecast.update(clock.now())
    assert [(s.arrivals, s.prompt_tokens, s.output_tokens) for s in samples] == [(1, 100, 20)]
