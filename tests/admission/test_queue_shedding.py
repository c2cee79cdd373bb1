"""A standing queue sheds: while the engines report no headroom and a tenant's queue has
not emptied for ``standing_after_s``, interactive work waits at most its class's
``standing_wait_s`` and then gets 429 ``overloaded``, instead of waiting until a deadline
by which its first token is long useless. Not while the engines have room, not when the
tenant's own hard cap holds it, not for classes without a limit, not with the flag off."""

from __future__ import annotations

import pytest

from kvgate.admission.core import AdmissionCore
from kvgate.clock import ManualClock
from kvgate.pipeline.outcomes import reject_status
from kvgate.types import AdmissionKind, AdmissionResult, RejectReason
from tests.admission.helpers import admit, request
from tests.admission.test_headroom import Room, core_with

TOTAL = 1000  # two 500-token requests fill it: the rest queue


def full_core(
    room: Room, flags: dict[str, bool] | None = None, **config: object
) -> tuple[AdmissionCore, ManualClock]:
    core, clock = core_with(room, flags, total_quota=TOTAL, **config)
    core.flags.set("dynamic_quota", False)
    for _ in range(2):
        assert admit(core, clock, request(prompt=400)).kind is AdmissionKind.ADMIT
    return core, clock


def queued(
    core: AdmissionCore, clock: ManualClock, priority_class: str = "interactive"
) -> AdmissionResult:
    result = admit(core, clock, request(prompt=400, priority_class=priority_class))
    assert result.kind is AdmissionKind.QUEUE
    return result


def expiries(core: AdmissionCore, clock: ManualClock, t0: float) -> dict[float, list[str]]:
    """Run the clock from deadline to deadline until the queue is empty: the reasons of
    what expired, by time since ``t0``."""
    seen: dict[float, list[str]] = {}
    while (deadline := core.queue.next_deadline()) is not None:
        clock.advance(max(0.0, deadline - clock.now()))
        out = core.expire(clock.now())
        seen[round(clock.now() - t0, 3)] = [str(i.outcome.reason) for i in out]
    return seen


def test_a_standing_queue_sheds_interactive_work_after_its_wait() -> None:
    core, clock = full_core(Room(False))
    t0 = clock.now()
    first = queued(core, clock)  # the queue starts standing 1 s from now
    clock.advance(0.9)
    second = queued(core, clock)  # stands at 1.0, has waited 0.25 s at 1.15
    clock.advance(0.5)
    third = queued(core, clock)  # 1.4: standing already, waits 0.25 s
    assert core.expire(clock.now()) == [first.ticket, second.ticket]
    assert expiries(core, clock, t0) == {1.65: ["overloaded"]}
    for result in (first, second, third):
        refusal = result.ticket.outcome
        assert refusal.reason == RejectReason.OVERLOADED
        assert reject_status(refusal) == 429 and refusal.retry_after_s == 1.0
    assert [r.ticket.outcome.queued_seconds for r in (first, second, third)] == pytest.approx(
        [1.4, 0.5, 0.25]
    )
    shed = core.metrics.queue_wait.labels("default", "shed")
    assert shed._sum.get() == pytest.approx(1.4 + 0.5 + 0.25)


def test_work_that_drains_before_the_queue_stands_is_admitted() -> None:
    core, clock = full_core(Room(False))
    item = queued(core, clock).ticket
    assert item.sheds and item.deadline == pytest.approx(clock.now() + 1.0)
    clock.advance(0.9)
    assert core.expire(clock.now()) == []
    core.queue.remove(item)  # it left (admitted or cancelled): the queue is empty again
    again = queued(core, clock).ticket  # a new backlog: a new second before it stands
    assert again.deadline == pytest.approx(clock.now() + 1.0)


@pytest.mark.parametrize(
    "setup",
    ["engines_have_room", "flag_off", "batch_class", "tenant_hard_cap"],
)
def test_no_shedding_when_the_engines_are_not_the_limit(setup: str) -> None:
    room = Room(setup == "engines_have_room")
    flags = {"queue_shedding": False} if setup == "flag_off" else None
    tenants = [{"name": "default", "hard_cap": TOTAL}] if setup == "tenant_hard_cap" else []
    core, clock = full_core(room, flags, tenants=tenants)
    klass = "batch" if setup == "batch_class" else "interactive"
    item = queued(core, clock, klass).ticket
    assert not item.sheds
    assert item.deadline == pytest.approx(clock.now() + core.config.queue.deadline_for(klass))
