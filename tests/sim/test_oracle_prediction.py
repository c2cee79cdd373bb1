"""The oracle's TTFT prediction against the simulated engine's actual first-token time.

For one request added to an engine in a given state, ``predict_ttft`` (a replay of the
engine's scheduler on a copy of its token counts) must give the time the engine itself
then produces the request's first token.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvgate.engine.core import EngineCore
from kvgate.engine.profiles import Profile, get_profile
from kvgate.engine.request import EngineEvent, EngineRequest, EventKind
from kvgate.sim.reference_policies import Extra, OraclePolicy, replay, snapshot
from kvgate.tokens import block_hashes

H100 = get_profile("llama3-8b-h100")
CPU = get_profile("gemma3-270m-cpu")


def _req(rid: str, prompt: int, out: int, key: str) -> EngineRequest:
    return EngineRequest(rid, prompt, block_hashes([f" {key}{i}" for i in range(prompt)]), out)


def _actual_ttft(core: EngineCore, req: EngineRequest, now: float) -> float:
    core.add_request(req, now)
    events: list[EngineEvent] = []
    while (t := core.next_step_time()) is not None:
        events += core.advance_to(t)
        for e in events:
            if e.kind is EventKind.FIRST_TOKEN and e.request_id == req.request_id:
                return e.time - now
    raise AssertionError("no first token")


def _predicted(core: EngineCore, req: EngineRequest, now: float) -> float:
    core.advance_to(now)  # as the simulator does before it routes a request arriving now
    oracle = OraclePolicy({"n": core})
    return oracle.predict(core, req.prompt_tokens, req.block_hashes, now)[0]


def _idle(core: EngineCore) -> float:
    return 0.0


def _cached_prefix(core: EngineCore) -> float:
    core.add_request(_req("warm", 3000, 1, "p"), 0.0)
    return 5.0


def _decoding_batch(core: EngineCore) -> float:
    for i in range(40):
        core.add_request(_req(f"d{i}", 900, 400, f"d{i}"), 0.001 * i)
    return 0.5  # all 40 are decoding, in a fast-forwarded run


def _few_decoding(core: EngineCore) -> float:
    for i in range(4):
        core.add_request(_req(f"d{i}", 64, 60, f"d{i}"), 0.01 * i)
    return 1.5  # four decoding, free slots left


def _queued_prefill(core: EngineCore) -> float:
    for i in range(3):
        core.add_request(_req(f"q{i}", 7000, 50, f"q{i}"), 0.0)
    return 0.0


def _long_chunked(core: EngineCore) -> float:
    core.add_request(_req("long", 30_000, 20, "L"), 0.0)
    return 0.05  # mid chunked prefill


def _slots_full(core: EngineCore) -> float:
    # CPU profile: 8 sequence slots; the new request waits for the shortest to finish
    for i in range(8):
        core.add_request(_req(f"s{i}", 64, 20 + 5 * i, f"s{i}"), 0.0)
    return 1.0


@pytest.mark.parametrize(
    ("profile", "setup", "prompt", "key"),
    [
        (H100, _idle, 2000, "n"),
        (H100, _cached_prefix, 3200, "p"),
        (H100, _decoding_batch, 1500, "n"),
        (H100, _queued_prefill, 1000, "n"),
        (H100, _queued_prefill, 7000, "q1"),  # shares the prefix of a queued request
        (H100, _long_chunked, 500, "n"),
        (CPU, _idle, 300, "n"),
        (CPU, _few_decoding, 200, "n"),
        (CPU, _slots_full, 100, "n"),
    ],
    ids=[
        "idle",
        "cached",
        "decoding",
        "queued",
        "queued-shared",
        "chunked",
        "cpu-idle",
        "cpu-decoding",
        "cpu-slots-full",
    ],
)
def test_prediction_matches_the_engine(
    profile: Profile, setup: Callable[[EngineCore], float], prompt: int, key: str
) -> None:
    core = EngineCore(profile)
    now = setup(core)
    req = _req("new", prompt, 5, key)
    predicted = _predicted(core, req, now)
    actual = _actual_ttft(core, req, now)
    assert predicted == pytest.approx(actual, rel=1e-6, abs=1e-9), (predicted, actual)


def _actual_first_tokens(
    core: EngineCore, arrivals: list[tuple[float, EngineRequest]]
) -> list[float]:
    """First-token time of each request, added to the engine at its arrival."""
    events: list[EngineEvent] = []
    for t, req in arrivals:
        events += core.advance_to(t)
        core.add_request(req, t)
    while (t := core.next_step_time()) is not None:
        events += core.advance_to(t)
    first = {e.request_id: e.time for e in events if e.kind is EventKind.FIRST_TOKEN}
    return [first[req.request_id] for _, req in arrivals]


@pytest.mark.parametrize(
    ("profile", "setup", "gaps"),
    [
        (H100, _idle, (0.0, 0.004)),  # the second arrives during the first's prefill
        (H100, _decoding_batch, (0.003, 0.021)),
        (H100, _queued_prefill, (0.01, 0.05)),
        (CPU, _few_decoding, (0.02, 0.05)),  # a decode run cut by each arrival
        (CPU, _idle, (0.5, 0.7)),  # the engine idles until the first arrives
    ],
    ids=["idle", "decoding", "queued", "cpu-decoding", "cpu-idle-gap"],
)
def test_replay_of_later_arrivals_matches_the_engine(
    profile: Profile, setup: Callable[[EngineCore], float], gaps: tuple[float, float]
) -> None:
    """The look-ahead's replay: requests arriving after ``now`` (each with its own
    output length) get their first tokens when the engine gives them theirs."""
    core = EngineCore(profile)
    now = setup(core)
    core.advance_to(now)
    a, b = _req("a", 900, 30, "a"), _req("b", 400, 10, "b")
    arrivals = [(now + gaps[0], a), (now + gaps[1], b)]
    oracle = OraclePolicy({"n": core})
    snap = snapshot(core, now, oracle._waiting_uncached)
    extras = [Extra(t, r.prompt_tokens, 0, r.output_tokens) for t, r in arrivals]
    predicted = replay(core, snap, extras)
    actual = _actual_first_tokens(core, arrivals)
    assert predicted == pytest.approx(actual, rel=1e-6, abs=1e-9), (predicted, actual)
