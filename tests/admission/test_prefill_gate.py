"""The prefill gate: pending prefill bounded, first tokens let queued work in, the limit
follows measured latency, other classes get a share, the flag turns it off."""

from __future__ import annotations

from typing import Any

from kvgate.admission.config import PrefillGateConfig
from kvgate.admission.metrics import AdmissionMetrics
from kvgate.admission.prefill_gate import PrefillGate
from kvgate.clock import run_now
from kvgate.types import AdmissionKind, AdmissionRequest
from tests.admission.helpers import admit, make_core, request

GATE = {"initial_tokens": 1000, "min_tokens": 100, "adapt_s": 1.0, "min_samples": 2}


def streamed(
    prompt: int = 400, priority_class: str = "interactive", tenant: str = "default"
) -> AdmissionRequest:
    req = request(tenant, prompt=prompt, max_tokens=10, priority_class=priority_class)
    req.stream = True
    return req


def gated_core(flags: dict[str, bool] | None = None, **gate: Any) -> Any:
    return make_core(flags, total_quota=100_000, prefill_gate={**GATE, **gate})


def test_pending_prefill_stays_under_the_limit_and_a_first_token_admits_the_queued() -> None:
    core, clock = gated_core()
    results = [admit(core, clock, streamed()) for _ in range(4)]
    kinds = [r.kind for r in results]
    # 400 + 400 fit in 1000; the third would make 1200: queued, as is the fourth (FIFO)
    assert kinds == [AdmissionKind.ADMIT] * 2 + [AdmissionKind.QUEUE] * 2
    assert core.gate.pending_tokens == 800
    assert results[2].reason == "prefill_gate"
    clock.advance(0.2)
    admitted = run_now(core.progress(results[0], 1, clock.now()))
    assert [i.request.request_id for i in admitted] == [results[2].ticket.request.request_id]
    assert core.gate.pending_tokens == 800  # one left the backlog, one came in
    assert run_now(core.progress(results[0], 5, clock.now())) == []  # only the first token
    # counted once per held request, not per drain attempt
    assert core.metrics.prefill_held.labels("interactive")._value.get() == 2


def test_progress_now_keeps_the_books_and_asks_for_a_drain_only_when_a_place_frees() -> None:
    core, clock = gated_core()
    results = [admit(core, clock, streamed()) for _ in range(3)]
    clock.advance(0.2)
    # the synchronous part of progress: the first token leaves the backlog at once...
    assert core.progress_now(results[0], 1, clock.now()) is True
    assert core.gate.pending_tokens == 400
    assert len(core.queue) == 1  # ...and the queued request waits for the drain
    assert core.progress_now(results[0], 5, clock.now()) is False  # only the first token
    admitted = run_now(core.drain(clock.now()))
    assert [i.request.request_id for i in admitted] == [results[2].ticket.request.request_id]
    off, off_clock = gated_core({"prefill_gate": False})
    first = admit(off, off_clock, streamed())
    assert off.progress_now(first, 1, off_clock.now()) is False


def test_one_request_always_passes_an_empty_gate() -> None:
    core, clock = gated_core()
    assert admit(core, clock, streamed(prompt=5000)).kind is AdmissionKind.ADMIT


def test_other_classes_fill_only_their_share() -> None:
    core, clock = gated_core(other_share=0.5)
    assert admit(core, clock, streamed(400, "batch")).kind is AdmissionKind.ADMIT
    assert admit(core, clock, streamed(400, "batch")).kind is AdmissionKind.QUEUE  # 800 > 500
    # (another tenant: each tenant's queue is FIFO)
    assert admit(core, clock, streamed(400, "interactive", "t2")).kind is AdmissionKind.ADMIT


def test_release_without_a_first_token_frees_the_gate() -> None:
    core, clock = gated_core()
    first = admit(core, clock, streamed(600))
    run_now(core.release(first, clock.now()))
    assert core.gate.pending_tokens == 0


def test_off_switch_admits_past_the_gate() -> None:
    core, clock = gated_core(flags={"prefill_gate": False})
    kinds = {admit(core, clock, streamed()).kind for _ in range(5)}
    assert kinds == {AdmissionKind.ADMIT}


def gate(**cfg: Any) -> PrefillGate:
    return PrefillGate(PrefillGateConfig(**{**GATE, "target_s": 0.5, **cfg}), AdmissionMetrics())


def cycle(g: PrefillGate, now: float, latency: float, n: int = 4) -> None:
    """n first tokens of the given latency; the last one (at ``now``) ends the step."""
    for k in range(n):
        at = now if k == n - 1 else now - 0.01
        g.admitted(f"{now}-{k}", 100, at - latency, stream=True)
        g.first_token(f"{now}-{k}", at)


def test_limit_shrinks_when_first_tokens_are_slow_and_grows_only_while_holding() -> None:
    g = gate()
    g.adapt(0.0)  # starts the adaptation clock
    cycle(g, 1.0, 2.0)  # 4x the target: cut, at most by max_growth
    assert g.limit == 500
    cycle(g, 2.0, 0.1)  # fast, but nothing was held back: no evidence to grow on
    assert g.limit == 500
    g.admitted("x", 450, 2.95, stream=True)
    assert not g.allows(100, "interactive")  # 450 + 100 > 500: held
    cycle(g, 3.0, 0.1)
    assert g.limit == 1000  # x2 at most per step
    assert g.metrics.prefill_limit._value.get() == 1000


def test_limit_stays_within_its_bounds() -> None:
    g = gate(min_tokens=400, max_tokens=1500)
    g.adapt(0.0)
    for t in range(1, 6):
        cycle(g, float(t), 5.0)
    assert g.limit == 400
    for t in range(6, 12):
        g.admitted(f"h{t}", 1490, t - 0.02, stream=True)
        assert not g.allows(100, "interactive")  # held: the limit may grow
        cycle(g, float(t), 0.05)
        g.first_token(f"h{t}", float(t))
    assert g.limit == 1500


def test_non_streamed_requests_are_not_counted() -> None:
    g = gate()
    g.admitted("n", 900, 0.0, stream=False)
    assert g.pending_tokens == 0 and g.allows(900, "interactive")
