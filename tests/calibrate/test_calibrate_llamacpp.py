"""`kvgate calibrate` against a real llama.cpp server (``-m real_engine``).

llama-server with 2 slots of 2,048 tokens: a third concurrent request waits in its
deferred queue for a free slot, so the knee is at most at 2 — earlier when one thread
is already saturated by one request (on a loaded 2-core machine it often is). The
runtime tokens come from /slots and can never exceed what the busy slots hold.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from kvgate.calibrate.profile import CapacityProfile
from kvgate.procs.llama import LlamaServer, missing_reason, start_llama_server

pytestmark = pytest.mark.real_engine

CONTEXT, OUTPUT = 256, 32


@pytest.fixture
def llama() -> Iterator[LlamaServer]:
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    server = start_llama_server(parallel=2, ctx_size=4096)
    yield server
    server.stop()


@pytest.mark.timeout(420)
def test_calibrate_finds_the_slot_limit_of_llama_server(llama: LlamaServer, tmp_path: Path) -> None:
    out, plot = tmp_path / "profile.yaml", tmp_path / "knee.png"
    cmd = [
        sys.executable, "-m", "kvgate", "calibrate", "--target", llama.url,
        "--engine-type", "llamacpp", "--model-version", "gemma-3-270m-q4_k_m",
        "--deployment", "cpu-1t-np2", "--context", str(CONTEXT), "--output-tokens", str(OUTPUT),
        "--step-requests", "4", "--step-seconds", "40", "--growth", "1.5",
        "--max-concurrency", "5", "--max-seconds", "360", "--out", str(out), "--plot", str(plot),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr
    profile = CapacityProfile.from_dict(yaml.safe_load(out.read_text()))
    assert profile.knee_concurrency in (1, 2), done.stderr  # never past the 2 slots
    assert profile.details["runtime_tokens_source"] == "engine_kv"  # from /slots
    assert profile.details["latency_source"] == "client"  # llama.cpp has no histogram
    # the busy slots hold a prompt (~224 tokens) and part of an output each
    slots = profile.knee_concurrency
    assert 0.5 * slots * CONTEXT <= profile.capacity_runtime_tokens <= 1.3 * slots * CONTEXT
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
