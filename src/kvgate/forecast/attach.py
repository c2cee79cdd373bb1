"""Wiring the forecast into a running dynamic quota (simulator or gateway).

``attach(dynamic_quota, pipeline, flags, now, fallback, ...)`` creates the
``DemandForecast``, swaps the controller's capacity callable for ``forecast_capacity``
(which only changes anything while flag ``forecast`` is on) and observes arrivals where
both drivers (gateway and simulator) ask admission: ``RequestPipeline.admit``. Samples
go to ``sink`` (e.g. the store).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvgate.flags import Flags
from kvgate.forecast.provider import DemandForecast, forecast_capacity
from kvgate.forecast.samples import MinuteSample
from kvgate.types import AdmissionRequest, AdmissionResult


def attach(
    dynamic_quota: Any,  # anything with a ``capacity`` callable attribute (DynamicQuota)
    pipeline: Any,  # anything with ``arrival_observers`` (RequestPipeline)
    flags: Flags,
    now: Callable[[], float],
    fallback: Callable[[], int],
    *,
    interval_s: float = 60.0,
    season_minutes: int = 1440,
    horizon_minutes: int = 10,
    sink: Callable[[MinuteSample], None] | None = None,
) -> DemandForecast:
    forecast = DemandForecast(
        interval_s=interval_s,
        season_minutes=season_minutes,
        horizon_minutes=horizon_minutes,
        sink=sink,
    )
    measured = dynamic_quota.capacity or (lambda: None)
    dynamic_quota.capacity = forecast_capacity(measured, forecast, flags, now, fallback)
    pipeline.arrival_observers.append(arrival_observer(forecast))
    return forecast


def arrival_observer(
    forecast: DemandForecast,
) -> Callable[[float, AdmissionRequest, AdmissionResult], None]:
    """Each admission answer → one arrival sample (admitted or not)."""

    def observe(arrived: float, req: AdmissionRequest, result: AdmissionResult) -> None:
        # the output bound the request holds: the client's max_tokens, else the model default
        bound = req.max_tokens if req.max_tokens is not None else result.output_bound
        forecast.observe_arrival(arrived, req.tenant, req.priority_class, req.prompt_tokens, bound)

    return observe


def summary(forecast: DemandForecast) -> dict[str, Any]:
    """Figures for a run's summary: the forecast's own accuracy and last ratio."""
    return {
        "forecast_horizon_samples": forecast.horizon,
        "forecast_mape_pct": forecast.score.mape,
        "forecast_scored_samples": len(forecast.score.abs_pct_errors),
        "forecast_samples": forecast.samples,
    }


def sim_forecast(sim: Any) -> DemandForecast | None:
    """The forecast for a ``ClusterSim`` with admission (None without): one-line hook.

    The workload's ``sample_s`` is the forecaster's minute and a season is one of its
    days (``day_s``), for the compressed-day workloads; else 60 s and 1,440 minutes.
    Samples are written to the admission store (``/kvgate/forecast/samples/…``).
    """
    if sim.dynamic_quota is None or sim.admission is None:
        return None
    from kvgate.clock import run_now
    from kvgate.forecast.samples import SAMPLE_TTL_S, store_key

    params = sim.workload.params
    interval = float(params.get("sample_s", 60.0))
    season = round(float(params.get("day_s", 86400.0)) / interval)
    store = sim.admission.store

    def sink(sample: MinuteSample) -> None:
        run_now(store.put(store_key(sample.minute), sample.to_json(), ttl=SAMPLE_TTL_S))

    return attach(
        sim.dynamic_quota,
        sim.pipeline,
        sim.flags,
        sim.clock.now,
        lambda: int(sim.admission.config.total_quota),
        interval_s=interval,
        season_minutes=max(2, season),
        horizon_minutes=int(params.get("forecast_horizon", 10)),
        sink=sink,
    )
