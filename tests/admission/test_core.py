"""AdmissionCore decisions, driven synchronously in virtual time (ManualClock + MemoryStore)."""

from __future__ import annotations

from kvgate.admission.config import AdmissionConfig
from kvgate.admission.core import AdmissionCore
from kvgate.clock import ManualClock, run_now
from kvgate.store.base import StoreUnavailable
from kvgate.store.memory import MemoryStore
from kvgate.types import AdmissionKind, RejectReason
from tests.admission.helpers import admit, make_core, release, request

TWO_TENANTS = {
    "total_quota": 1000,
    "tenants": [
        {"name": "a", "guaranteed": 400, "weight": 1},
        {"name": "b", "guaranteed": 200, "weight": 1, "hard_cap": 600},
    ],
}


def test_admit_within_guarantee_then_elastic_then_queue() -> None:
    core, clock = make_core(**TWO_TENANTS)
    first = admit(core, clock, request("a", 200, 200))
    assert (first.kind, first.reason, first.reserved_tokens) == (
        AdmissionKind.ADMIT,
        "within_guarantee",
        400,
    )
    second = admit(core, clock, request("a", 200, 200))
    assert (second.kind, second.reason) == (AdmissionKind.ADMIT, "elastic")
    # a's elastic use (400) is the whole pool: b still has its guarantee
    assert admit(core, clock, request("a", 50, 50)).kind is AdmissionKind.QUEUE
    b = admit(core, clock, request("b", 100, 100))
    assert (b.kind, b.reason) == (AdmissionKind.ADMIT, "within_guarantee")
    assert core.snapshot()["used"] == 1000


def test_hard_cap_and_oversized_requests() -> None:
    core, clock = make_core(**TWO_TENANTS)
    too_big = admit(core, clock, request("b", 500, 200))
    assert (too_big.kind, too_big.reason) == (AdmissionKind.REJECT, RejectReason.TOO_LARGE)
    assert admit(core, clock, request("b", 300, 200)).kind is AdmissionKind.ADMIT
    queued = admit(core, clock, request("b", 100, 100))
    assert (queued.kind, queued.reason) == (AdmissionKind.QUEUE, "tenant_cap")


def test_queued_request_admitted_when_capacity_frees() -> None:
    core, clock = make_core(total_quota=500)
    held = admit(core, clock, request(prompt=200, max_tokens=200))
    queued = admit(core, clock, request(prompt=200, max_tokens=200))
    assert queued.kind is AdmissionKind.QUEUE
    clock.advance(3.0)
    admitted = release(core, clock, held)
    assert [i is queued.ticket for i in admitted] == [True]
    outcome = queued.ticket.outcome
    assert outcome.kind is AdmissionKind.ADMIT and outcome.queued_seconds == 3.0
    assert core.snapshot()["used"] == 400


def test_deadline_is_honoured_exactly() -> None:
    core, clock = make_core(
        total_quota=500, queue={"default_deadline_s": 30, "class_deadlines_s": {"batch": 5}}
    )
    admit(core, clock, request(prompt=400, max_tokens=100))
    interactive = admit(core, clock, request(prompt=100, max_tokens=100))
    batch = admit(core, clock, request(prompt=100, max_tokens=100, priority_class="batch"))
    assert core.queue.next_deadline() == 5.0
    clock.set(4.999)
    assert core.expire(clock.now()) == []
    clock.set(5.0)
    expired = core.expire(clock.now())
    assert expired == [batch.ticket]
    assert (expired[0].outcome.kind, expired[0].outcome.reason) == (
        AdmissionKind.REJECT,
        RejectReason.DEADLINE,
    )
    clock.set(29.999)
    assert core.expire(clock.now()) == []
    clock.set(30.0)
    [late] = core.expire(clock.now())
    assert late is interactive.ticket and late.outcome.queued_seconds == 30.0
    assert core.decisions.counts["reject"]["deadline"] == 2


def test_full_queue_rejects_with_retry_after_from_release_rate() -> None:
    core, clock = make_core(total_quota=1000, queue={"max_queue_tokens": 400})
    # measured release rate: 400 tokens over 2 s
    for r in [admit(core, clock, request(prompt=100, max_tokens=100)) for _ in range(2)]:
        clock.advance(1.0)
        release(core, clock, r)
    assert core.releases.rate(clock.now()) == 200.0
    running = [admit(core, clock, request(prompt=100, max_tokens=100)) for _ in range(5)]
    assert all(r.kind is AdmissionKind.ADMIT for r in running)
    assert admit(core, clock, request(prompt=100, max_tokens=100)).kind is AdmissionKind.QUEUE
    assert admit(core, clock, request(prompt=100, max_tokens=100)).kind is AdmissionKind.QUEUE
    rejected = admit(core, clock, request(prompt=100, max_tokens=100))
    assert (rejected.kind, rejected.reason) == (AdmissionKind.REJECT, RejectReason.QUEUE_FULL)
    # (400 queued + 200 of its own) at 200 tokens/s
    assert rejected.retry_after_s == 3.0


def test_drr_gives_long_requests_their_share_under_a_short_flood() -> None:
    # the flooding tenant has 9x the weight: its share alone would fill the cluster
    core, clock = make_core(
        total_quota=10_000,
        tenants=[{"name": "short", "weight": 9}, {"name": "long", "weight": 1}],
        queue={
            "long_request_threshold_tokens": 2000,
            "long_request_reserved_fraction": 0.1,
            "max_queue_tokens": 10**9,
            "default_deadline_s": 10**6,
        },
    )
    active = [admit(core, clock, request("short", prompt=50, max_tokens=50)) for _ in range(100)]
    assert all(r.kind is AdmissionKind.ADMIT for r in active)
    longs = [admit(core, clock, request("long", prompt=2500, max_tokens=500)) for _ in range(5)]
    assert all(r.kind is AdmissionKind.QUEUE for r in longs)
    completed_long = 0
    # flood: each step one request finishes and three new short ones arrive
    for _step in range(3000):
        clock.advance(0.01)
        done = active.pop(0)
        for item in release(core, clock, done):
            active.append(item.outcome)
            completed_long += item.is_long
        for _ in range(3):
            r = admit(core, clock, request("short", prompt=50, max_tokens=50))
            if r.kind is AdmissionKind.ADMIT:
                active.append(r)
        if completed_long == len(longs):
            break
    assert completed_long == len(longs), f"only {completed_long} long requests admitted"
    assert core.snapshot()["used"] <= 10_000


def test_guarantee_holds_while_another_tenant_floods() -> None:
    core, clock = make_core(**TWO_TENANTS)
    flood = []
    for _ in range(20):
        r = admit(core, clock, request("a", 50, 50))
        if r.kind is AdmissionKind.ADMIT:
            flood.append(r)
    assert sum(r.reserved_tokens for r in flood) == 800  # guarantee 400 + the pool 400
    got = admit(core, clock, request("b", 100, 100))
    assert (got.kind, got.reason) == (AdmissionKind.ADMIT, "within_guarantee")


def test_degraded_work_reserves_within_caps_and_total() -> None:
    config = {
        "total_quota": 1000,
        "tenants": [
            {"name": "a", "weight": 1, "hard_cap": 700},
            {"name": "b", "weight": 1},
        ],
        "degrade": {"modes": {"batch": "economy_pool"}},
    }
    core, clock = make_core(**config)
    a1 = admit(core, clock, request("a", prompt=200, max_tokens=200))
    b = admit(core, clock, request("b", prompt=50, max_tokens=50))
    waiting = admit(core, clock, request("b", prompt=600, max_tokens=100))
    assert (waiting.kind, waiting.reason) == (AdmissionKind.QUEUE, "total")
    # b waits, so a is held to its fair share (500): interactive work queues ...
    interactive = admit(core, clock, request("a", prompt=100, max_tokens=100))
    assert (interactive.kind, interactive.reason) == (AdmissionKind.QUEUE, "tenant_share")
    core.cancel(interactive.ticket, clock.now())
    # ... batch work degrades past the share
    batch = admit(core, clock, request("a", prompt=100, max_tokens=100, priority_class="batch"))
    assert (batch.kind, batch.degrade_to, batch.reserved_tokens) == (
        AdmissionKind.DEGRADE,
        "economy_pool",
        200,
    )
    # ... and is in the ledger and the store like anything else
    assert run_now(core.store.usage()) == {"a": 600, "b": 100}
    assert core.snapshot()["tenants"]["a"]["degraded_reserved"] == 200
    # never past the hard cap (700)
    big = admit(core, clock, request("a", prompt=150, max_tokens=100, priority_class="batch"))
    assert (big.kind, big.reason) == (AdmissionKind.QUEUE, "tenant_cap")
    for r in (a1, b, batch):
        release(core, clock, r)
    assert run_now(core.store.usage()) == {"a": 250, "b": 700}  # both queued ones got in
    core_off, clock_off = make_core(flags={"degrade": False}, **config)
    admit(core_off, clock_off, request("a", prompt=200, max_tokens=200))
    admit(core_off, clock_off, request("b", prompt=50, max_tokens=50))
    admit(core_off, clock_off, request("b", prompt=600, max_tokens=100))
    off = admit(
        core_off, clock_off, request("a", prompt=100, max_tokens=100, priority_class="batch")
    )
    assert (off.kind, off.reason) == (AdmissionKind.QUEUE, "tenant_share")


def test_async_work_waits_in_the_queue_and_reserves_when_admitted() -> None:
    core, clock = make_core(total_quota=500, degrade={"modes": {"batch": "async"}})
    held = admit(core, clock, request(prompt=300, max_tokens=100))
    job = admit(core, clock, request(prompt=100, max_tokens=100, priority_class="batch"))
    # answered at once, but nothing reserved: it waits its turn in the queue
    assert (job.kind, job.degrade_to, job.reserved_tokens) == (AdmissionKind.DEGRADE, "async", 0)
    assert core.snapshot()["tenants"]["default"]["queued_tokens"] == 200
    assert run_now(core.store.usage()) == {"default": 400}
    [item] = release(core, clock, held)
    assert item is job.ticket and item.outcome.reserved_tokens == 200
    assert item.outcome.degrade_to == "async"
    assert run_now(core.store.usage()) == {"default": 200}
    release(core, clock, item.outcome)


def test_admission_flag_off_admits_everything() -> None:
    core, clock = make_core(flags={"admission": False}, total_quota=10)
    result = admit(core, clock, request(prompt=10_000, max_tokens=10_000))
    assert (result.kind, result.reason) == (AdmissionKind.ADMIT, "admission_off")
    release(core, clock, result)


def test_the_reservation_covers_the_output_bound_and_never_grows() -> None:
    core, clock = make_core(total_quota=1000)
    result = admit(core, clock, request(prompt=100, max_tokens=50))
    assert (result.reserved_tokens, result.output_bound) == (150, 50)
    run_now(core.progress(result, 40))
    assert core.snapshot()["used"] == 150
    run_now(core.progress(result, 80))  # the engine went past max_tokens: metered only
    assert core.snapshot()["used"] == 150
    assert core.ledger.held_total == 180
    overrun = core.metrics.registry.get_sample_value(
        "kvgate_admission_bound_overrun_tokens_total", {"tenant": "default"}
    )
    assert overrun == 30
    release(core, clock, result)
    release(core, clock, result)  # a second release is a no-op
    assert core.snapshot()["used"] == 0
    assert run_now(core.store.usage()) == {}


def test_output_bound_is_max_tokens_else_the_model_default_clamped_by_context() -> None:
    core, clock = make_core(
        total_quota=100_000,
        output={
            "default_max_tokens": 500,
            "model_max_tokens": {"m": 2000},
            "model_context_tokens": {"m": 4096},
        },
    )
    # short completions in the past never shrink a reservation
    for _ in range(30):
        r = admit(core, clock, request(prompt=10, max_tokens=1000))
        run_now(core.progress(r, 5))
        release(core, clock, r)
    assert admit(core, clock, request(prompt=10, max_tokens=1000)).reserved_tokens == 1010
    no_bound = request(prompt=10, max_tokens=None)
    assert admit(core, clock, no_bound).output_bound == 500
    in_model = request(prompt=3000, max_tokens=None)
    in_model.model = "m"
    assert admit(core, clock, in_model).output_bound == 1096  # 4096 - 3000
    asked = request(prompt=3000, max_tokens=3000)
    asked.model = "m"
    assert admit(core, clock, asked).reserved_tokens == 4096


def test_watermark_is_the_larger_of_ledger_and_engine_usage() -> None:
    core, clock = make_core(total_quota=1000)
    reported: list[int | None] = [None]
    core.ledger.engine_usage = lambda: reported[0]
    r = admit(core, clock, request(prompt=100, max_tokens=100))
    assert core.ledger.watermark() == 100  # held = prompt + generated
    reported[0] = 700
    assert core.ledger.watermark() == 700
    release(core, clock, r)


def test_store_quota_values_apply() -> None:
    core, _clock = make_core(**TWO_TENANTS)
    assert core.book.apply_store_value("/kvgate/global/quota/total", "2000")
    assert core.total == 2000
    assert core.book.apply_store_value(
        "/kvgate/tenant/b/quota", '{"guaranteed": 300, "weight": 2, "hard_cap": 900}'
    )
    q = core.book.quota_for("b")
    assert (q.guaranteed, q.weight, q.hard_cap) == (300, 2.0, 900)
    assert not core.book.apply_store_value("/kvgate/tenant/b/quota", "not json")


class _FlakyStore(MemoryStore):
    """A MemoryStore whose server "goes away" on demand (a partition, data kept)."""

    down = False

    async def release(self, gateway_id: str, tenant: str, tokens: int) -> None:
        if self.down:
            raise StoreUnavailable("partitioned")
        await super().release(gateway_id, tenant, tokens)

    async def heartbeat(self, gateway_id: str, ttl_s: float) -> None:
        if self.down:
            raise StoreUnavailable("partitioned")
        await super().heartbeat(gateway_id, ttl_s)


def _release_during_partition(lease_s: float) -> tuple[ManualClock, _FlakyStore, AdmissionCore]:
    """A core whose only reservation (200 tokens) is released while the store is down."""
    clock = ManualClock()
    store = _FlakyStore(clock)
    core = AdmissionCore(AdmissionConfig(total_quota=1000), store, gateway_id="gw")
    run_now(core.refresh(lease_s))
    held = admit(core, clock, request(prompt=100, max_tokens=100))
    store.down = True
    release(core, clock, held)
    return clock, store, core


def test_releases_missed_during_a_partition_are_replayed_on_recovery() -> None:
    clock, store, core = _release_during_partition(10)
    assert not core.link.up
    assert run_now(store.usage()) == {"default": 200}  # the store never heard
    store.down = False
    clock.advance(1)
    run_now(core.refresh(10))
    assert core.link.up
    assert run_now(store.usage()) == {}


def test_missed_releases_are_dropped_when_the_lease_is_gone() -> None:
    clock, store, core = _release_during_partition(2)
    clock.advance(5)  # our lease expired: the tokens were reclaimed by a reap
    assert run_now(store.reap()) == 200
    store.down = False
    other = AdmissionCore(AdmissionConfig(total_quota=1000), store, gateway_id="gw")
    kept = admit(other, clock, request(prompt=100, max_tokens=100))  # same id, new holding
    run_now(core.refresh(2))
    assert run_now(store.usage()) == {"default": 200}  # the stale release was not replayed
    release(other, clock, kept)


def test_guarantee_claims_are_counted_honoured_or_refused() -> None:
    core, clock = make_core(**TWO_TENANTS)
    first = admit(core, clock, request("b", 50, 50))  # fits b's unused guarantee (200)
    # a backlog in b's own queue refuses a claim that would fit (FIFO per tenant)
    admit(core, clock, request("a", 400, 400))
    big = admit(core, clock, request("b", 200, 200))
    assert big.kind is AdmissionKind.QUEUE
    second = admit(core, clock, request("b", 25, 25))
    assert second.kind is AdmissionKind.QUEUE
    claims = core.metrics.registry.get_sample_value
    honoured = claims(
        "kvgate_admission_guarantee_claims_total", {"tenant": "b", "outcome": "honoured"}
    )
    refused = claims(
        "kvgate_admission_guarantee_claims_total", {"tenant": "b", "outcome": "refused"}
    )
    assert (honoured, refused) == (1, 1)
    release(core, clock, first)
