"""The dynamic-quota rule: bracket the right total between "fine" and "too much", bisect.

Each period yields one observation of the current total: *too much* when the watched
class's admission → first-token percentile is over its target (``ttft_ratio`` > 1) or
KV use is above the tighten watermark (80%); *fine* when neither holds while work was
queued or refused (the total was what limited it). The rule keeps the highest fine total
and the lowest too-much total it has seen (each forgotten after ``memory`` periods, or at
once when a newer observation contradicts it: capacity moved) and moves:

* too much, nothing fine known: down by the measured excess (1 / ttft_ratio, or the KV
  middle / KV use), at least ×1/``max_step``, at most ×0.85;
* fine, nothing too-much known: up toward the middle of the watermarks (50%–80% KV)
  by KV use, at least ×1.1 and at most ×``max_step`` (at most ×``precision``² when it
  was fine here before: a careful probe once an old too-much mark was forgotten);
* both known: to their geometric mean (bisection) until they are within
  ``precision`` of each other, then it holds at the fine one;
* no unmet demand and nothing too much: hold (the total is not what limits anyone).

Multiplicative decrease and bounded increase, like AIMD, but the brackets make each
step halve the remaining range instead of walking it in fixed 10% steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Observation:
    total: int
    kv_ratio: float | None  # KV tokens held by admitted work / KV capacity
    ttft_ratio: float | None  # first-token percentile / target (None: too few samples)
    demand: bool  # work was queued or refused since the last step


@dataclass(frozen=True, slots=True)
class Move:
    total: int
    direction: str  # tighten | relax | hold
    pressure: float | None  # the worse signal, 1.0 = at the limit


class QuotaRule:
    def __init__(
        self,
        *,
        tighten_above: float,
        relax_below: float,
        max_step: float,
        precision: float = 1.1,
        memory: int = 6,
    ) -> None:
        self.tighten_above = tighten_above
        self.kv_middle = (tighten_above + relax_below) / 2
        self.max_step = max_step
        self.precision = precision
        self.memory = memory
        self.fine: tuple[int, int] | None = None  # (total, period seen)
        self.too_much: tuple[int, int] | None = None
        self._period = 0

    def pressure(self, obs: Observation) -> float | None:
        signals = [obs.ttft_ratio] if obs.ttft_ratio is not None else []
        if obs.kv_ratio is not None:
            signals.append(obs.kv_ratio / self.tighten_above)
        return max(signals) if signals else None

    def _forget(self) -> None:
        for name in ("fine", "too_much"):
            mark = getattr(self, name)
            if mark is not None and self._period - mark[1] >= self.memory:
                setattr(self, name, None)

    def next_total(self, obs: Observation) -> Move:
        self._period += 1
        self._forget()
        p = self.pressure(obs)
        t = obs.total
        if p is not None and p > 1.0:
            self.too_much = (t, self._period)
            if self.fine is not None and self.fine[0] >= t:
                self.fine = None  # capacity shrank: what was fine is not any more
            if self.fine is not None:
                return Move(int(math.sqrt(self.fine[0] * t)), "tighten", p)
            factor = 1.0 / obs.ttft_ratio if obs.ttft_ratio and obs.ttft_ratio > 1 else 1.0
            if obs.kv_ratio is not None and obs.kv_ratio > self.tighten_above:
                factor = min(factor, self.kv_middle / obs.kv_ratio)
            factor = max(1.0 / self.max_step, min(0.85, factor))
            return Move(max(1, int(t * factor)), "tighten", p)
        if not obs.demand:
            return Move(t, "hold", p)
        probing = self.fine is not None  # it was here before: climb carefully
        self.fine = (t, self._period) if self.fine is None or t >= self.fine[0] else self.fine
        if self.too_much is not None and self.too_much[0] <= t:
            self.too_much = None  # capacity grew: what was too much is not any more
        if self.too_much is not None:
            high = self.too_much[0]
            if high <= self.fine[0] * self.precision:
                return Move(self.fine[0] if t != self.fine[0] else t, "hold", p)
            return Move(int(math.sqrt(self.fine[0] * high)), "relax", p)
        factor = 2.0
        if obs.kv_ratio is not None and obs.kv_ratio > 0:
            factor = self.kv_middle / obs.kv_ratio
        factor = min(self.max_step, max(1.1, factor))
        if probing:
            factor = min(factor, self.precision**2)
        return Move(int(t * factor), "relax", p)
