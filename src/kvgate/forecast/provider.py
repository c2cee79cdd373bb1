"""The forecast a dynamic-quota controller can use to act before a peak, not after.

``DemandForecast`` turns per-minute samples into a Holt-Winters forecast of the
runtime tokens asked for per minute (prompt + output bound of the arrivals) and keeps
score of itself (MAPE of the forecast made ``horizon`` minutes earlier). Its
``demand_ratio(now)`` is the highest forecast over the next ``horizon`` minutes divided
by the demand of the last minutes: > 1 means a rise is coming.

``forecast_capacity(capacity, forecast, flags, …)`` is the provider the dynamic quota
takes in place of its capacity callable (the controller compares its watermark with
capacity, and never raises the total above ``max(total_quota, capacity)`` or the
absolute hard cap). With flag ``forecast`` on, by ``mode``:

* ``raise`` (default): ``capacity × max(1, ratio)`` — ahead of a forecast rise the
  controller relaxes instead of tightening into the peak, and its ceiling rises with the
  forecast (at most ``max_ratio`` × capacity, never above ``absolute_hard_cap``); with
  no rise forecast it is the plain controller;
* ``track``: ``capacity / ratio`` — the watermark is read as the forecast one: tighten
  ahead of a rise, relax ahead of a fall;
* ``hold``: ``capacity / min(1, ratio)`` — only a forecast fall changes anything.

docs/benchmarks.md ("forecast") has the three measured on the daily workload. With the
flag off, or before a whole season has been seen, the capacity is returned unchanged:
the plain dynamic quota.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from kvgate.flags import Flags
from kvgate.forecast.model import HoltWinters
from kvgate.forecast.samples import MinuteRecorder, MinuteSample

MODES = ("raise", "track", "hold")


@dataclass(slots=True)
class ForecastScore:
    """Accuracy of the forecast made ``horizon`` minutes before each actual minute."""

    horizon: int
    abs_pct_errors: list[float]
    minutes: list[int] = field(default_factory=list)  # the minute each error is for

    def mape_where(self, keep: Callable[[int], bool]) -> float | None:
        """MAPE over the scored minutes ``keep`` accepts (e.g. a peak window)."""
        errs = [e for m, e in zip(self.minutes, self.abs_pct_errors, strict=True) if keep(m)]
        return 100.0 * sum(errs) / len(errs) if errs else None

    @property
    def mape(self) -> float | None:
        if not self.abs_pct_errors:
            return None
        return 100.0 * sum(self.abs_pct_errors) / len(self.abs_pct_errors)


class DemandForecast:
    def __init__(
        self,
        *,
        interval_s: float = 60.0,
        season_minutes: int = 1440,
        horizon_minutes: int = 10,
        min_ratio: float = 0.5,
        max_ratio: float = 2.0,
        recent_minutes: int = 3,
        sink: Callable[[MinuteSample], None] | None = None,
        alpha: float = 0.2,
        beta: float = 0.01,
        gamma: float = 0.3,
        mode: str = "raise",
    ) -> None:
        if not 1 <= horizon_minutes <= season_minutes:
            raise ValueError("horizon_minutes must be within 1..season_minutes")
        self.recorder = MinuteRecorder(interval_s)
        self.model = HoltWinters(season_minutes, alpha=alpha, beta=beta, gamma=gamma)
        self.horizon = horizon_minutes
        self.min_ratio, self.max_ratio = min_ratio, max_ratio
        self.sink = sink
        self._recent: deque[float] = deque(maxlen=recent_minutes)
        self._pending: dict[int, float] = {}  # minute -> forecast made horizon minutes before
        self.score = ForecastScore(horizon_minutes, [])
        self.samples = 0
        self.last_ratio: float | None = None
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}")
        self.mode = mode

    # -- input -------------------------------------------------------------------------
    def observe_arrival(
        self, now: float, tenant: str, priority_class: str, prompt_tokens: int, output_tokens: int
    ) -> None:
        self.recorder.observe_arrival(now, tenant, priority_class, prompt_tokens, output_tokens)
        self.update(now)

    def observe_hit(self, now: float, prompt_tokens: int, cached_tokens: int) -> None:
        self.recorder.observe_hit(now, prompt_tokens, cached_tokens)

    def update(self, now: float) -> None:
        """Fold every minute that ended by ``now`` into the model."""
        for sample in self.recorder.close(now):
            self._learn(sample)

    def _learn(self, sample: MinuteSample) -> None:
        y = float(sample.tokens)
        predicted = self._pending.pop(sample.minute, None)
        if predicted is not None and y > 0:
            self.score.abs_pct_errors.append(abs(predicted - y) / y)
            self.score.minutes.append(sample.minute)
        self.model.update(y)
        self._recent.append(y)
        self.samples += 1
        if self.model.seasonal:  # score only the seasonal forecaster, not the warm-up
            self._pending[sample.minute + self.horizon] = self.model.forecast(self.horizon)
        if self.sink is not None:
            self.sink(sample)

    # -- output ------------------------------------------------------------------------
    def forecast(self, minutes_ahead: int) -> float | None:
        if self.model.level is None:
            return None
        return self.model.forecast(minutes_ahead)

    def demand_ratio(self, now: float) -> float | None:
        """Peak forecast over the horizon / recent demand; None until a season is known."""
        self.update(now)
        if not self.model.seasonal or not self._recent:
            return None
        recent = sum(self._recent) / len(self._recent)
        ahead = max(self.model.forecast(h) for h in range(1, self.horizon + 1))
        ratio = ahead / recent if recent > 0 else (self.max_ratio if ahead > 0 else 1.0)
        self.last_ratio = max(self.min_ratio, min(self.max_ratio, ratio))
        return self.last_ratio


def forecast_capacity(
    capacity: Callable[[], int | None],
    forecast: DemandForecast,
    flags: Flags,
    now: Callable[[], float],
    fallback: Callable[[], int],
) -> Callable[[], int | None]:
    """The capacity callable for the dynamic quota, seen through the forecast."""

    def seen() -> int | None:
        measured = capacity()
        if not flags.enabled("forecast"):
            return measured
        ratio = forecast.demand_ratio(now())
        if ratio is None:
            return measured
        base = measured if measured else fallback()
        if forecast.mode == "track":
            return max(1, int(base / ratio))
        if forecast.mode == "hold":
            return max(1, int(base / min(1.0, ratio)))
        return max(1, int(base * max(1.0, ratio)))  # raise

    return seen


def tokens_needed(
    forecast: DemandForecast,
    in_flight: Callable[[], float],
    now: Callable[[], float],
) -> Callable[[float], float | None]:
    """``forecast(t)`` → runtime tokens needed at time ``t`` (None: no opinion).

    The shape a controller that "raises the total to what the forecast needs" takes (the
    admission layer's ``DynamicQuota(forecast=…)``): today's runtime tokens in flight
    scaled by how much the demand is forecast to grow by ``t`` (never below today's).
    """

    def needed(t: float) -> float | None:
        current = now()
        ratio = forecast.demand_ratio(current)
        if ratio is None:
            return None
        horizon = max(1, round((t - current) / forecast.recorder.interval_s))
        ahead = forecast.forecast(min(horizon, forecast.horizon))
        recent = sum(forecast._recent) / len(forecast._recent) if forecast._recent else 0.0
        if ahead is None or recent <= 0:
            return None
        growth = max(1.0, min(forecast.max_ratio, ahead / recent))
        return in_flight() * growth

    return needed
