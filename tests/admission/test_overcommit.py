"""Over-admission is explicit, metered and reconciled with engine-reported KV use."""

from __future__ import annotations

from kvgate.types import AdmissionKind
from tests.admission.helpers import admit, make_core, release, request


def test_overcommit_admits_past_the_total_but_never_past_a_hard_cap() -> None:
    core, clock = make_core(
        total_quota=1000, overcommit=1.5, tenants=[{"name": "a", "hard_cap": 1200}]
    )
    held = [admit(core, clock, request("a", 100, 200)) for _ in range(4)]
    assert [r.kind for r in held] == [AdmissionKind.ADMIT] * 4  # 1200 > total 1000
    assert admit(core, clock, request("a", 100, 200)).kind is AdmissionKind.QUEUE  # the cap
    other = [admit(core, clock, request("b", 100, 50)) for _ in range(3)]
    assert [r.kind for r in other] == [
        AdmissionKind.ADMIT,
        AdmissionKind.ADMIT,
        AdmissionKind.QUEUE,
    ]
    assert core.snapshot()["used"] == 1500  # total x 1.5
    core.reconcile()
    excess = core.metrics.registry.get_sample_value("kvgate_admission_overcommit_excess_tokens")
    assert excess == 500
    for r in held + other[:2]:
        release(core, clock, r)


def test_engine_kv_at_the_total_pauses_overcommit_until_it_falls() -> None:
    core, clock = make_core(total_quota=1000, overcommit=2.0)
    engine: list[int | None] = [None]
    core.ledger.engine_usage = lambda: engine[0]
    first = admit(core, clock, request(prompt=500, max_tokens=500))
    engine[0] = 1000  # the engines really hold the whole total
    assert core.reconcile() == 1.0
    assert admit(core, clock, request(prompt=100, max_tokens=100)).kind is AdmissionKind.QUEUE
    paused = core.metrics.registry.get_sample_value("kvgate_admission_overcommit_paused_total")
    assert paused == 1
    engine[0] = 850  # between the resume mark (800) and the total: still paused
    assert core.reconcile() == 1.0
    engine[0] = 500
    assert core.reconcile() == 2.0
    assert core.snapshot()["overcommit"] == 2.0
    release(core, clock, first)


def test_without_overcommit_the_total_is_the_limit() -> None:
    core, clock = make_core(total_quota=1000)
    core.ledger.engine_usage = lambda: 0
    r = admit(core, clock, request(prompt=500, max_tokens=500))
    assert admit(core, clock, request(prompt=1, max_tokens=1)).kind is AdmissionKind.QUEUE
    assert core.reconcile() == 1.0
    release(core, clock, r)
