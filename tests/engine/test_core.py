"""EngineCore and scheduler in virtual time (no HTTP)."""

from __future__ import annotations

import random

import pytest

from kvgate.engine.core import EngineCore
from kvgate.engine.profiles import PROFILES, get_profile
from kvgate.engine.request import EngineEvent, EngineRequest, EventKind
from kvgate.tokens import BLOCK_SIZE, block_hashes, synthetic_text, tokenize

GEMMA = get_profile("gemma3-270m-cpu")


def req(rid: str, prompt: int, out: int, key: int | None = None) -> EngineRequest:
    """A request whose prompt blocks hash under ``key`` (same key = same prefix)."""
    base = key if key is not None else hash(rid)
    pieces = [f" w{base}_{i}" for i in range(prompt)]
    return EngineRequest(rid, prompt, block_hashes(pieces), out)


def drain(core: EngineCore) -> list[EngineEvent]:
    events: list[EngineEvent] = []
    while (t := core.next_event_time()) is not None:
        events += core.advance_to(t)
    return events


def first_token_time(events: list[EngineEvent], rid: str) -> float:
    return next(e.time for e in events if e.kind is EventKind.FIRST_TOKEN and e.request_id == rid)


def test_single_request_timeline_matches_the_profile() -> None:
    core = EngineCore(GEMMA)
    core.add_request(req("a", 100, 5), 0.0)
    events = drain(core)
    kinds = [e.kind for e in events]
    assert kinds == [EventKind.FIRST_TOKEN, EventKind.TOKENS, EventKind.FINISHED]
    ttft = first_token_time(events, "a")
    assert ttft == pytest.approx(GEMMA.step_time(100, 1, 100))
    assert ttft == pytest.approx(100 * 3.125e-3 + 14.1e-3, rel=0.01)
    assert sum(e.count for e in events if e.kind is not EventKind.FINISHED) == 5
    s = core.stats()
    assert (s.running, s.waiting, s.prompt_tokens, s.generation_tokens, s.finished) == (
        0, 0, 100, 5, 1,
    )  # fmt: skip


def test_cached_tokens_are_full_blocks_and_cut_ttft() -> None:
    core = EngineCore(GEMMA)
    core.add_request(req("a", 200, 1, key=1), 0.0)
    ev_a = drain(core)
    core.add_request(req("b", 200, 1, key=1), 100.0)
    ev_b = drain(core)
    first_b = next(e for e in ev_b if e.kind is EventKind.FIRST_TOKEN)
    assert first_b.cached_tokens == (200 // BLOCK_SIZE) * BLOCK_SIZE
    assert first_token_time(ev_b, "b") - 100.0 < first_token_time(ev_a, "a") / 5
    s = core.stats()
    assert s.prefix_cache_queries == 400 and s.prefix_cache_hits == 192


def test_ttft_grows_with_uncached_prompt_length() -> None:
    ttfts = []
    for n in (64, 256, 1024):
        core = EngineCore(GEMMA)
        core.add_request(req("x", n, 1), 0.0)
        ttfts.append(first_token_time(drain(core), "x"))
    assert ttfts[0] < ttfts[1] < ttfts[2]


def test_fully_cached_prompt_recomputes_last_block() -> None:
    core = EngineCore(GEMMA)
    core.add_request(req("a", 64, 1, key=3), 0.0)
    drain(core)
    core.add_request(req("b", 64, 1, key=3), 10.0)
    first = next(e for e in drain(core) if e.kind is EventKind.FIRST_TOKEN)
    assert first.cached_tokens == 48


def test_chunked_prefill_respects_token_budget() -> None:
    core = EngineCore(GEMMA, max_num_batched_tokens=512)
    core.add_request(req("long", 1500, 2), 0.0)
    events = drain(core)
    # 1500 prompt tokens in chunks of 512: 3 prefill steps, then one decode step.
    assert core.stats().steps == 4
    expected = (
        GEMMA.step_time(512, 1, 512) + GEMMA.step_time(512, 1, 1024) + GEMMA.step_time(476, 1, 1500)
    )
    assert first_token_time(events, "long") == pytest.approx(expected)


def test_decode_shares_the_step_with_a_prefill_chunk() -> None:
    core = EngineCore(GEMMA, max_num_batched_tokens=64)
    core.add_request(req("a", 10, 50), 0.0)
    core.advance_to(1.0)  # a is decoding
    core.add_request(req("b", 200, 1), 1.0)
    t = core.next_event_time()
    assert t is not None
    core.advance_to(t)  # b joins at the next step boundary
    plan = core._step.plan if core._step else None
    # One decode token for a, the rest of the budget for b's first chunk.
    assert plan is not None and [n for _, n in plan.scheduled] == [1, 63]


def test_max_num_seqs_limits_the_running_batch() -> None:
    core = EngineCore(GEMMA, max_num_seqs=3)
    for i in range(7):
        core.add_request(req(f"r{i}", 20, 30), 0.0)
    t = core.next_event_time()  # the first step started with r0 alone
    assert t is not None and core.stats().running == 1
    events = core.advance_to(t)
    s = core.stats()
    assert (s.running, s.waiting) == (3, 4)
    events += drain(core)
    assert core.stats().finished == 7
    # FCFS: requests get their first token in arrival order.
    order = [e.request_id for e in events if e.kind is EventKind.FIRST_TOKEN]
    assert order == [f"r{i}" for i in range(7)]


def test_preemption_by_recompute_when_blocks_run_out() -> None:
    core = EngineCore(GEMMA, kv_blocks=12)  # 192 tokens of KV
    for i in range(3):
        core.add_request(req(f"r{i}", 40, 100), 0.0)
    events = drain(core)
    preempted = [e for e in events if e.kind is EventKind.PREEMPTED]
    assert preempted, "three requests of 140 tokens cannot fit in 192 tokens of KV"
    s = core.stats()
    assert s.preemptions == len(preempted)
    assert s.finished == 3 and s.num_free_blocks == 12
    for i in range(3):
        produced = sum(
            e.count
            for e in events
            if e.request_id == f"r{i}" and e.kind in (EventKind.FIRST_TOKEN, EventKind.TOKENS)
        )
        assert produced == 100
    # The last-admitted request is the victim and gets its first token only once.
    assert preempted[0].request_id == "r2"
    assert sum(1 for e in events if e.kind is EventKind.FIRST_TOKEN) == 3


def test_preempted_request_goes_to_the_front_of_waiting() -> None:
    core = EngineCore(GEMMA, kv_blocks=8, max_num_seqs=2)
    core.add_request(req("a", 30, 90), 0.0)
    core.add_request(req("b", 30, 90), 0.0)
    core.add_request(req("c", 30, 5), 0.0)
    while core.stats().preemptions == 0:
        t = core.next_event_time()
        assert t is not None
        core.advance_to(t)
    assert [s.request_id for s in core.scheduler.waiting][:2] == ["b", "c"]


def test_lru_eviction_under_kv_pressure_and_hit_counters() -> None:
    core = EngineCore(GEMMA, kv_blocks=16)  # 256 tokens
    t = 0.0
    for key in (1, 2, 3):  # three 96-token prefixes; only two fit with room to run
        core.add_request(req(f"p{key}", 96, 1, key=key), t)
        drain(core)
        t += 10.0
    hashes = {k: req("x", 96, 1, key=k).block_hashes for k in (1, 2, 3)}
    assert core.cached_prefix_tokens(hashes[1]) < 96  # oldest evicted first
    assert core.cached_prefix_tokens(hashes[3]) == 96
    hits_before = core.stats().prefix_cache_hits
    core.add_request(req("again3", 96, 1, key=3), t)
    drain(core)
    assert core.stats().prefix_cache_hits - hits_before == 80  # 5 of 6 blocks reused
    hits_before = core.stats().prefix_cache_hits
    core.add_request(req("again1", 96, 1, key=1), t + 10)
    drain(core)
    assert core.stats().prefix_cache_hits - hits_before < 80


def test_cached_prefix_tokens_does_not_change_eviction_order() -> None:
    core = EngineCore(GEMMA, kv_blocks=8)
    for key in (1, 2):
        core.add_request(req(f"p{key}", 64, 1, key=key), 0.0)
        drain(core)
    before = core.scheduler.kv.pool.eviction_order()
    h1 = req("x", 64, 1, key=1).block_hashes
    assert core.cached_prefix_tokens(h1) == 64
    assert core.scheduler.kv.pool.eviction_order() == before


def test_abort_frees_blocks_and_reset_prefix_cache_drops_cached() -> None:
    core = EngineCore(GEMMA, kv_blocks=32)
    core.add_request(req("a", 100, 200, key=9), 0.0)
    core.advance_to(1.0)
    assert core.stats().num_free_blocks < 32
    assert core.abort("a") and not core.abort("a")
    assert core.stats().num_free_blocks == 32 and core.next_event_time() is not None
    drain(core)
    h = req("x", 100, 1, key=9).block_hashes
    assert core.cached_prefix_tokens(h) == 96
    assert core.reset_prefix_cache()
    assert core.cached_prefix_tokens(h) == 0


def test_add_request_rejects_requests_beyond_the_context() -> None:
    core = EngineCore(GEMMA, kv_blocks=10)
    assert core.profile.max_model_len == 160  # clamped to the KV capacity
    with pytest.raises(ValueError, match="max_model_len"):
        core.add_request(req("big", 150, 20), 0.0)
    core.add_request(req("ok", 150, 10), 0.0)
    with pytest.raises(ValueError, match="duplicate"):
        core.add_request(req("ok", 10, 10), 0.0)


def _random_run(seed: int, *, fast_forward: bool, probes: int) -> list[tuple[str, str, float, int]]:
    core = EngineCore(GEMMA, kv_blocks=40, max_num_batched_tokens=256, fast_forward=fast_forward)
    rng = random.Random(seed)
    t = 0.0
    events: list[EngineEvent] = []
    for i in range(80):
        gap = rng.expovariate(1.5)
        for k in range(probes):
            events += core.advance_to(t + gap * k / max(probes, 1))
        t += gap
        events += core.advance_to(t)
        key = rng.randrange(4)
        core.add_request(req(f"r{i}", rng.randint(5, 200), rng.randint(1, 150), key=key), t)
        if rng.random() < 0.05:
            core.abort(f"r{rng.randrange(i + 1)}")
    events += drain(core)
    out = [(e.kind.value, e.request_id, round(e.time, 9), e.cached_tokens) for e in events]
    # Token events are grouped differently; compare everything else exactly.
    return [x for x in out if x[0] != EventKind.TOKENS.value]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fast_forward_gives_the_same_timeline_as_single_steps(seed: int) -> None:
    slow = _random_run(seed, fast_forward=False, probes=0)
    assert _random_run(seed, fast_forward=True, probes=0) == slow
    assert _random_run(seed, fast_forward=True, probes=5) == slow


def test_long_decode_costs_events_not_steps() -> None:
    core = EngineCore(get_profile("llama3-8b-h100"))
    for i in range(8):
        core.add_request(req(f"r{i}", 1000, 50_000), 0.0)
    events = drain(core)
    assert core.stats().generation_tokens == 8 * 50_000
    assert len(events) <= 64  # vs 50,000 steps
    assert core.stats().steps >= 50_000


def test_requests_from_text_hash_like_the_gateway() -> None:
    text = synthetic_text(100, random.Random(0))
    r = EngineRequest.from_text("t", text, 4)
    assert r.prompt_tokens == 100
    assert r.block_hashes == block_hashes(tokenize(text))


def test_profiles_are_derived_and_named() -> None:
    assert {"llama3-8b-h100", "llama3-70b-h100-tp4", "gemma3-270m-cpu"} <= set(PROFILES)
    p8 = get_profile("llama3-8b-h100")
    assert p8.kv_bytes_per_token == 128 * 1024
    assert get_profile("llama3-70b-h100-tp4").kv_bytes_per_token == 320 * 1024
    # Decode of one sequence is memory bound: ~16 GB of weights at 0.8 x 3.35 TB/s.
    assert 5e-3 < p8.step_time(1, 1, 1000) < 9e-3
    # Gemma calibration: decode 26 tok/s alone, ~19 tok/s each with two sequences.
    assert 1 / GEMMA.step_time(1, 1, 10) == pytest.approx(26, rel=0.03)
    assert 1 / GEMMA.step_time(2, 2, 20) == pytest.approx(19, rel=0.03)
    for p in PROFILES.values():
        total = sum(p.step_time(8, 8, 4000 + 8 * j) for j in range(30))
        assert p.decode_run_time(8, 4000, 30) == pytest.approx(total)
    with pytest.raises(ValueError, match="unknown"):
        get_profile("nope")


def test_events_of_steps_run_inside_add_request_are_not_lost() -> None:
    core = EngineCore(GEMMA)
    core.add_request(req("a", 20, 2), 0.0)
    core.add_request(req("b", 20, 2), 50.0)  # a finished long before; nobody advanced
    events = core.advance_to(50.0) + drain(core)
    finished = [e.request_id for e in events if e.kind is EventKind.FINISHED]
    assert finished == ["a", "b"]
