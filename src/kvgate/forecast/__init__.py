"""Capacity prediction from history: per-minute samples and a seasonal EWMA forecast.

``DemandForecast`` records samples (``MinuteRecorder``), forecasts the next minutes with
additive Holt-Winters (``HoltWinters``) and scores itself (MAPE); ``forecast_capacity``
is the provider the dynamic quota accepts (flag ``forecast``, off by default).
"""

from __future__ import annotations

from kvgate.forecast.model import Explanation, HoltWinters
from kvgate.forecast.provider import DemandForecast, ForecastScore, forecast_capacity
from kvgate.forecast.samples import SAMPLES_PREFIX, MinuteRecorder, MinuteSample, store_key

__all__ = [
    "SAMPLES_PREFIX",
    "DemandForecast",
    "Explanation",
    "ForecastScore",
    "HoltWinters",
    "MinuteRecorder",
    "MinuteSample",
    "forecast_capacity",
    "store_key",
]
