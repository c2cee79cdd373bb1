"""The dynamic-quota rule: estimate the total from the headroom, bracket, hold near the limit.

Each period yields one observation of the current total and its pressure ``p``: the
worse of the watched class's admission → first-token percentile over its target
(``ttft_ratio``) and KV use over the tighten watermark (80%). *Too much* when ``p`` > 1;
*fine* otherwise while work was queued or refused (the total was what limited it). The
rule keeps the highest fine and the lowest too-much total (each forgotten after
``memory`` periods, or at once when a newer observation contradicts it: capacity moved)
and moves, taking latency and KV as proportional to the total below the knee:

* too much: × the measured excess (1 / excess, at least ×1/``max_step``, at most
  ×0.85), not below the geometric mean with a known fine total (above the knee latency
  is a cliff and the excess says little);
* fine within ``precision`` of the limit (``p`` > 1/precision): hold (hysteresis);
* fine: toward the middle of that hold band (× 0.955/``p``; KV: toward the middle of
  the 50–80% watermarks), at most ×``max_step``, and with a too-much total known at most
  to the geometric mean of the two; once the two are within ``precision``, hold at the
  fine one; after a too-much mark was forgotten, at most ×``precision`` a period, and
  while the signals are near the limit (``p`` > 1/precision²) not past that forgotten
  mark / ``precision``: a re-probe stays in the band below the old knee unless the
  signals show clear headroom (capacity grew);
* no unmet demand and nothing too much: hold.

``breach`` is the multiplicative decrease a check inside the period applies at once
when latency is far over target (dynamic_quota.py).
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
        decrease: float = 0.7,
    ) -> None:
        self.decrease = decrease
        self.tighten_above = tighten_above
        self.kv_middle = (tighten_above + relax_below) / 2
        self.max_step = max_step
        self.precision = precision
        self.memory = memory
        self.fine: tuple[int, int] | None = None  # (total, period seen)
        self.too_much: tuple[int, int] | None = None
        self._period = 0
        self.forgot_high: int | None = None  # a too-much total whose mark was forgotten

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
                if name == "too_much":
                    self.forgot_high = mark[0]

    def breach(self, total: int, ttft_ratio: float) -> Move:
        """A check inside the period saw latency far over target: cut at once.

        Multiplicative decrease by ``decrease`` (not by the measured excess: above the
        knee latency is a cliff, and right after a change it is inflated by the burst of
        admissions), never below the last total seen fine. The total is marked too much;
        a remembered fine total at or above it is dropped (capacity shrank)."""
        self.too_much, self.forgot_high = (total, self._period), None
        if self.fine is not None and self.fine[0] >= total:
            self.fine = None
        cut = max(1, int(total * self.decrease))
        if self.fine is not None:
            cut = max(self.fine[0], cut)
        return Move(cut, "breach", ttft_ratio)

    def _excess(self, obs: Observation) -> float:
        """How far over the limit the worse signal is (> 1), from latency and KV."""
        excess = obs.ttft_ratio if obs.ttft_ratio is not None else 1.0
        if obs.kv_ratio is not None:
            excess = max(excess, obs.kv_ratio / self.kv_middle)
        return excess

    def next_total(self, obs: Observation) -> Move:
        self._period += 1
        self._forget()
        p = self.pressure(obs)
        t = obs.total
        if p is not None and p > 1.0:
            self.too_much, self.forgot_high = (t, self._period), None
            if self.fine is not None and self.fine[0] >= t:
                self.fine = None  # capacity shrank: what was fine is not any more
            # the estimate: latency and KV in proportion to the total (true below the knee)
            factor = max(1.0 / self.max_step, min(0.85, 1.0 / self._excess(obs)))
            estimate = int(t * factor)
            if self.fine is not None:  # a cliff can make the estimate far too low
                estimate = max(estimate, int(math.sqrt(self.fine[0] * t)))
            return Move(max(1, estimate), "tighten", p)
        if not obs.demand:
            return Move(t, "hold", p)
        self.fine = (t, self._period) if self.fine is None or t >= self.fine[0] else self.fine
        if self.too_much is not None and self.too_much[0] <= t:
            self.too_much = None  # capacity grew: what was too much is not any more
        # within ``precision`` of the limit: hold (hysteresis). Else aim at the middle of
        # that band, taking latency and KV in proportion to the total below the knee.
        if p is not None and p * self.precision > 1.0:
            return Move(t, "hold", p)
        room = (1.0 + 1.0 / self.precision) / 2 / p if p else self.max_step
        if self.too_much is not None:
            high = self.too_much[0]
            if high <= self.fine[0] * self.precision + 1:  # (+1: the estimate rounds down)
                return Move(self.fine[0] if t != self.fine[0] else t, "hold", p)
            # the proportional estimate, kept a band below the too-much total; at least
            # halfway (geometric) to it when the estimate is timid
            estimate = min(int(t * room), int(high / self.precision))
            target = max(estimate, min(int(math.sqrt(self.fine[0] * high)), int(t * room)))
            return Move(max(t, target), "relax", p)
        factor = 2.0
        if obs.kv_ratio is not None and obs.kv_ratio > 0:
            factor = self.kv_middle / obs.kv_ratio
        factor = min(self.max_step, room, max(1.1, factor))
        if self.forgot_high is not None:  # a too-much mark was forgotten: probe step by step
            factor = min(factor, self.precision)
            if p is not None and p * self.precision**2 > 1.0:  # near the limit: stay below
                cap = max(t, int(self.forgot_high / self.precision))
                return Move(min(int(t * factor), cap), "relax" if cap > t else "hold", p)
        return Move(int(t * factor), "relax", p)
