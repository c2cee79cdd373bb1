"""Engine-sim speeds stated as measured figures (``--decode-ms-per-token``,
``--prefill-tokens-per-s``) instead of the roofline, in virtual time and on the CLI."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvgate.engine.core import EngineCore
from kvgate.engine.profiles import DECODE_BATCH_SLOWDOWN, get_profile
from kvgate.engine.request import EngineEvent, EngineRequest, EventKind
from kvgate.tokens import block_hashes

BASE = get_profile("llama3-8b-h100")


def _req(rid: str, prompt: int, out: int) -> EngineRequest:
    return EngineRequest(rid, prompt, block_hashes([f" {rid}{i}" for i in range(prompt)]), out)


def _run(core: EngineCore) -> list[EngineEvent]:
    events: list[EngineEvent] = []
    while (t := core.next_event_time()) is not None:
        events += core.advance_to(t)
    return events


@pytest.mark.parametrize("ms", [5.0, 20.0, 40.0])
def test_one_request_decodes_at_the_stated_speed(ms: float) -> None:
    profile = BASE.with_overrides(decode_ms_per_token=ms, prefill_tokens_per_s=20_000)
    core = EngineCore(profile)
    core.add_request(_req("a", 2000, 65), 0.0)
    events = _run(core)
    first = next(e.time for e in events if e.kind is EventKind.FIRST_TOKEN)
    done = next(e.time for e in events if e.kind is EventKind.FINISHED)
    # the prefill step also samples the first token; 64 decode steps follow
    assert first == pytest.approx(ms / 1000 + 1999 / 20_000, rel=1e-6)
    assert done - first == pytest.approx(64 * ms / 1000, rel=1e-6)


def test_decode_slows_with_the_running_batch() -> None:
    profile = BASE.with_overrides(decode_ms_per_token=20.0)
    assert profile.step_time(8, 8, 0) == pytest.approx(0.020 * (1 + 7 * DECODE_BATCH_SLOWDOWN))
    assert profile.decode_run_time(8, 0, 10) == pytest.approx(10 * profile.step_time(8, 8, 0))
    assert profile.decode_run_time(8, 0, 10) > BASE.with_overrides(
        decode_ms_per_token=20.0
    ).decode_run_time(1, 0, 10)


def test_prefill_override_alone_keeps_the_roofline_decode() -> None:
    profile = BASE.with_overrides(prefill_tokens_per_s=10_000)
    assert profile.decode_run_time(4, 1000, 5) == BASE.decode_run_time(4, 1000, 5)
    # 1000 prompt tokens at 10k tok/s on top of the roofline's one-token step
    assert profile.step_time(1001, 1, 0) == pytest.approx(BASE.step_time(1, 1, 0) + 0.1)


def test_non_positive_speeds_are_refused() -> None:
    with pytest.raises(ValueError, match="decode_ms_per_token"):
        BASE.with_overrides(decode_ms_per_token=0.0)
    with pytest.raises(ValueError, match="prefill_tokens_per_s"):
        BASE.with_overrides(prefill_tokens_per_s=-5.0)


def test_cli_refuses_a_bad_speed_naming_the_option() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kvgate", "engine-sim", "--decode-ms-per-token", "-1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--decode-ms-per-token must be > 0" in done.stderr
