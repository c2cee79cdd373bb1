"""Additive Holt-Winters (seasonal EWMA): level + trend + a seasonal term per slot.

For each new sample ``y`` (one per minute):

    level    = alpha * (y - season[slot]) + (1 - alpha) * (level + trend)
    trend    = beta  * (level - previous level) + (1 - beta) * trend
    season   = gamma * (y - level) + (1 - gamma) * season[slot]

and the forecast ``h`` samples ahead is ``level + h * trend + season[slot + h]``. Until a
whole season has been seen there is no seasonal term (``season = 0``): it is Holt's
linear trend, i.e. an EWMA that follows a ramp. After the first season the seasonal
terms start as that season's deviations from its mean. Everything is kept, so a
forecast can be explained term by term (``explain``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Explanation:
    level: float
    trend: float
    seasonal: float
    horizon: int

    @property
    def value(self) -> float:
        return max(0.0, self.level + self.horizon * self.trend + self.seasonal)


@dataclass(slots=True)
class HoltWinters:
    period: int  # samples per season (1,440 for a day of minutes)
    alpha: float = 0.2
    beta: float = 0.01
    gamma: float = 0.3
    level: float | None = None
    trend: float = 0.0
    season: list[float] = field(default_factory=list)
    seen: int = 0
    _first: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.period < 2:
            raise ValueError("period must be >= 2 samples")
        for name in ("alpha", "beta", "gamma"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in (0, 1]")

    def _slot(self, index: int) -> int:
        return index % self.period

    def update(self, y: float) -> None:
        i = self.seen
        self.seen += 1
        if self.level is None:
            self.level = y
            self._first.append(y)
            return
        s = self.season[self._slot(i)] if self.season else 0.0
        previous = self.level
        self.level = self.alpha * (y - s) + (1 - self.alpha) * (previous + self.trend)
        self.trend = self.beta * (self.level - previous) + (1 - self.beta) * self.trend
        if self.season:
            self.season[self._slot(i)] = self.gamma * (y - self.level) + (1 - self.gamma) * s
        else:
            self._first.append(y)
            if len(self._first) == self.period:
                mean = sum(self._first) / self.period
                self.season = [v - mean for v in self._first]
                self.level = mean + self.period / 2 * self.trend
                self._first = []

    def explain(self, horizon: int) -> Explanation:
        if self.level is None:
            raise ValueError("no samples yet")
        seasonal = self.season[self._slot(self.seen - 1 + horizon)] if self.season else 0.0
        return Explanation(self.level, self.trend, seasonal, horizon)

    def forecast(self, horizon: int) -> float:
        return self.explain(horizon).value

    @property
    def seasonal(self) -> bool:
        return bool(self.season)
