"""Per-minute samples of the demand: arrivals by tenant and class, token sizes, hit rate.

``MinuteRecorder.observe_*`` is called per request (cheap: counters and a bounded
reservoir); ``close(now)`` returns the samples of every minute that has ended. Samples
are kept in the store under ``/kvgate/forecast/samples/<minute>`` (``store_key``) with a
TTL, so any replica (or ``kvgate`` tooling) can read the history.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from kvgate.store.keys import ROOT

SAMPLES_PREFIX = f"{ROOT}/forecast/samples/"
SAMPLE_TTL_S = 8 * 24 * 3600.0  # a week of history plus a day


@dataclass(slots=True)
class MinuteSample:
    minute: int  # floor(start time / interval)
    arrivals: int = 0
    by_tenant: dict[str, int] = field(default_factory=dict)
    by_class: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    output_tokens: int = 0  # requested output bound (max_tokens)
    prompt_p50: float = 0.0
    prompt_p90: float = 0.0
    output_p50: float = 0.0
    output_p90: float = 0.0
    hit_rate: float | None = None  # cached / prompt tokens of requests that started

    @property
    def tokens(self) -> int:
        """Runtime tokens asked for in the minute: the quota's demand."""
        return self.prompt_tokens + self.output_tokens

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> MinuteSample:
        data: dict[str, Any] = json.loads(text)
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def store_key(minute: int) -> str:
    return f"{SAMPLES_PREFIX}{minute:012d}"


def _quantile(values: list[int], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, math.floor(q * len(ordered)))])


@dataclass(slots=True)
class _Open:
    minute: int
    by_tenant: Counter[str] = field(default_factory=Counter)
    by_class: Counter[str] = field(default_factory=Counter)
    prompts: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    prompt_sum: int = 0
    output_sum: int = 0
    hit_prompt: int = 0
    hit_cached: int = 0


class MinuteRecorder:
    MAX_KEPT = 4096  # sizes kept per minute for the percentiles

    def __init__(self, interval_s: float = 60.0) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.interval_s = interval_s
        self._open: _Open | None = None
        self._closed: list[MinuteSample] = []

    def _minute(self, now: float) -> int:
        return math.floor(now / self.interval_s)

    def _at(self, now: float) -> _Open:
        minute = self._minute(now)
        if self._open is not None and minute < self._open.minute:
            return self._open  # a late observation counts in the open minute
        if self._open is None or self._open.minute != minute:
            if self._open is not None:
                self._closed.append(self._finish(self._open))
                for gap in range(self._open.minute + 1, minute):  # quiet minutes count too
                    self._closed.append(MinuteSample(gap))
            self._open = _Open(minute)
        return self._open

    def observe_arrival(
        self, now: float, tenant: str, priority_class: str, prompt_tokens: int, output_tokens: int
    ) -> None:
        m = self._at(now)
        m.by_tenant[tenant] += 1
        m.by_class[priority_class] += 1
        m.prompt_sum += prompt_tokens
        m.output_sum += output_tokens
        if len(m.prompts) < self.MAX_KEPT:
            m.prompts.append(prompt_tokens)
            m.outputs.append(output_tokens)

    def observe_hit(self, now: float, prompt_tokens: int, cached_tokens: int) -> None:
        m = self._at(now)
        m.hit_prompt += prompt_tokens
        m.hit_cached += cached_tokens

    def close(self, now: float) -> list[MinuteSample]:
        """Samples of the minutes that ended by ``now`` (each returned once)."""
        self._at(now)
        out, self._closed = self._closed, []
        return out

    @staticmethod
    def _finish(m: _Open) -> MinuteSample:
        return MinuteSample(
            minute=m.minute,
            arrivals=sum(m.by_tenant.values()),
            by_tenant=dict(m.by_tenant),
            by_class=dict(m.by_class),
            prompt_tokens=m.prompt_sum,
            output_tokens=m.output_sum,
            prompt_p50=_quantile(m.prompts, 0.5),
            prompt_p90=_quantile(m.prompts, 0.9),
            output_p50=_quantile(m.outputs, 0.5),
            output_p90=_quantile(m.outputs, 0.9),
            hit_rate=m.hit_cached / m.hit_prompt if m.hit_prompt else None,
        )
