"""The dynamic total quota loop, stepped by hand."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kvgate.admission.config import AdmissionConfig
from kvgate.admission.dynamic_quota import DynamicQuota
from kvgate.clock import run_now
from kvgate.store.keys import TOTAL_QUOTA, WATERMARK
from tests.admission.helpers import admit, make_core, request


def test_interval_is_validated_to_20_30_seconds() -> None:
    with pytest.raises(ValidationError, match=r"dynamic_quota\.interval_s"):
        AdmissionConfig(dynamic_quota={"interval_s": 5})
    assert AdmissionConfig().dynamic_quota.interval_s == 25


def test_tightens_above_80_relaxes_below_50_within_the_hard_cap() -> None:
    core, clock = make_core(
        total_quota=10_000,
        absolute_hard_cap=12_000,
        tenants=[{"name": "a", "guaranteed": 3000}],
        queue={"max_queue_tokens": 10**6},
    )
    engine_used = [9000]
    core.ledger.engine_usage = lambda: engine_used[0]
    loop = DynamicQuota(core, core.store, capacity=lambda: 10_000)

    step = run_now(loop.step(clock.now()))
    assert (step.direction, step.total) == ("tighten", 9000)
    for _ in range(30):
        run_now(loop.step(clock.now()))
    assert core.total == 3000  # never below the guarantees
    assert run_now(core.store.get(TOTAL_QUOTA)) == "3000"
    assert run_now(core.store.get(WATERMARK)) == "9000"

    engine_used[0] = 6500  # between the watermarks: hold
    assert run_now(loop.step(clock.now())).direction == "hold"

    engine_used[0] = 1000
    admit(core, clock, request("a", 2000, 1000))
    admit(core, clock, request("a", 2000, 1000))  # queued: demand exists
    for _ in range(40):
        run_now(loop.step(clock.now()))
    assert core.total == 12_000  # the absolute hard cap
    assert core.metrics.dynamic_adjustments.labels("relax")._value.get() > 0


def test_total_never_exceeds_the_hard_cap_from_the_store_either() -> None:
    core, _ = make_core(total_quota=1000, absolute_hard_cap=1500)
    core.book.apply_store_value(TOTAL_QUOTA, "999999")
    assert core.total == 1500
