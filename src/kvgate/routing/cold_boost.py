"""Cold-node compensation: a new or re-registered node gets a boost that decays linearly.

boost(age) = max(0, 1 - age / warmup_s): 1.0 right after (re-)registration, 0 after the
warm-up window (default 30 min). Linear rather than exponential so the boost ends at a
known time; the policy multiplies it by ``cold_boost_weight``.
"""

from __future__ import annotations


def cold_boost(age_s: float, warmup_s: float) -> float:
    if warmup_s <= 0 or age_s >= warmup_s:
        return 0.0
    return 1.0 - max(0.0, age_s) / warmup_s
