"""Knee detection over the steps of a concurrency ramp (pure; no I/O).

Rule (docs/operations.md, "capacity calibration"): walking the steps in order of
concurrency, step *i* is past the knee when

1. more than ``max_error_rate`` (5%) of its requests failed, or its p99 TTFT exceeds
   the SLO (``slo_ttft_p99``), or its p99 TPOT exceeds ``slo_tpot_p99`` (SLOs
   optional) — final at once; or
2. its TTFT left the flat region, *and* by more than ``ttft_margin_s`` (tiny absolute
   values at low load are noise): its p99 is above ``ttft_factor`` × the flat floor
   (the median p99 of the steps before it), or its mean is above ``mean_factor`` × the
   median mean of the steps before it. A step measures a few dozen requests, so its p99 is nearly
   its maximum and jumps on one unlucky request (and an engine histogram's buckets are
   coarse); the mean is exact (the histogram's sum / count) and steady, and it rises
   as soon as a share of the requests queue for a free slot; or
3. throughput stopped rising: it rose by less than ``min_throughput_gain`` (a quarter)
   of the relative concurrency increase over the best earlier step; or
4. the engine preempted requests during the step (its KV cache is full: work is being
   recomputed, not added) — read from the engine's own preemption counter.

Rules 2-4 are relative to noisy readings, so they need confirmation: the next step
must be past the knee as well (against the same floors); a lone outlier is noise.

The knee is the last step before the first step past it. If no step is past it, the
ramp did not reach the knee and the result says so (``reached=False``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StepStats:
    """What one ramp step measured (the parts the rule reads)."""

    concurrency: int
    ttft_p99: float  # seconds
    tpot_p99: float  # seconds
    throughput: float  # output tokens per second
    ttft_mean: float = 0.0  # seconds
    preemptions: float = 0.0  # engine-reported preemptions during the step
    error_rate: float = 0.0  # failed requests / measured requests


@dataclass(frozen=True, slots=True)
class KneeRule:
    ttft_factor: float = 4.0
    mean_factor: float = 1.5
    ttft_margin_s: float = 0.05
    min_throughput_gain: float = 0.25
    max_preemptions: float = 0.0
    max_error_rate: float = 0.05
    slo_ttft_p99: float | None = None
    slo_tpot_p99: float | None = None


@dataclass(frozen=True, slots=True)
class Knee:
    index: int  # index of the knee step (the last good one); -1 when even the first is bad
    past_index: int | None  # the first step past the knee; None when not reached
    reason: str  # slo_*, ttft_*_left_flat, throughput_flat, preempting, not_reached
    flat_ttft_p99: float  # the flat-region floor the p99 rule compared against
    flat_ttft_mean: float = 0.0  # the floor the mean rule compared against
    confirmed: bool = True  # False: a relative rule fired on the last step only

    @property
    def reached(self) -> bool:
        return self.past_index is not None


def past_knee(
    s: StepStats,
    rule: KneeRule,
    floor: float,
    best: tuple[int, float] | None,
    mean_floor: float,
) -> str | None:
    """Why step ``s`` is past the knee (compared with the floors before it), or None."""
    if s.error_rate > rule.max_error_rate:
        return "errors"
    if rule.slo_ttft_p99 is not None and s.ttft_p99 > rule.slo_ttft_p99:
        return "slo_ttft"
    if rule.slo_tpot_p99 is not None and s.tpot_p99 > rule.slo_tpot_p99:
        return "slo_tpot"
    if s.ttft_p99 > rule.ttft_factor * floor and s.ttft_p99 - floor > rule.ttft_margin_s:
        return "ttft_p99_left_flat"
    if (
        mean_floor > 0
        and s.ttft_mean > rule.mean_factor * mean_floor
        and s.ttft_mean - mean_floor > rule.ttft_margin_s
    ):
        return "ttft_mean_left_flat"
    if best is not None:
        best_c, best_throughput = best
        wanted = rule.min_throughput_gain * max(0.0, s.concurrency / best_c - 1.0)
        if s.throughput <= best_throughput * (1.0 + wanted):
            return "throughput_flat"
    if s.preemptions > rule.max_preemptions:
        return "preempting"
    return None


def find_knee(steps: Sequence[StepStats], rule: KneeRule) -> Knee:
    """The knee of ``steps`` (sorted by concurrency) under ``rule``.

    An SLO breach is final at once. The relative rules (p99, mean, throughput, preemption) need the
    next step to be past the knee too; a lone outlier is read as noise. A relative hit
    on the last step is ``unconfirmed`` (the ramp runs one more step).
    """
    if not steps:
        return Knee(-1, None, "not_reached", 0.0)
    for i, s in enumerate(steps):
        if i == 0:
            if s.error_rate > rule.max_error_rate:
                return Knee(-1, 0, "errors", s.ttft_p99, s.ttft_mean)
            if rule.slo_ttft_p99 is not None and s.ttft_p99 > rule.slo_ttft_p99:
                return Knee(-1, 0, "slo_ttft", s.ttft_p99, s.ttft_mean)
            continue
        before = steps[:i]
        floor = statistics.median(x.ttft_p99 for x in before)
        mean_floor = statistics.median(x.ttft_mean for x in before)
        top = max(before, key=lambda x: x.throughput)
        best = (top.concurrency, top.throughput)
        reason = past_knee(s, rule, floor, best, mean_floor)
        if reason is None:
            continue
        if reason.startswith("slo_") or reason == "errors":
            return Knee(i - 1, i, reason, floor, mean_floor)
        if i + 1 == len(steps):
            return Knee(i - 1, i, reason, floor, mean_floor, confirmed=False)
        if past_knee(steps[i + 1], rule, floor, best, mean_floor) is not None:
            return Knee(i - 1, i, reason, floor, mean_floor)
    before = steps
    return Knee(
        len(steps) - 1,
        None,
        "not_reached",
        statistics.median(x.ttft_p99 for x in before),
        statistics.median(x.ttft_mean for x in before),
    )
