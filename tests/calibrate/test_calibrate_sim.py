"""`kvgate calibrate` against `kvgate engine-sim`: the knee it finds matches the profile."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kvgate.calibrate.analytic import analytic_capacity
from kvgate.calibrate.profile import CapacityProfile
from kvgate.engine.profiles import get_profile
from kvgate.store import open_store

CONTEXT, OUTPUT = 1024, 128


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("overrides", "bound"),
    [({"kv_blocks": 1024}, "kv_cache"), ({"max_num_seqs": 8}, "max_num_seqs")],
)
def test_knee_within_15_percent_of_the_analytic_capacity(
    sim_engines, etcd_server, tmp_path: Path, overrides: dict[str, int], bound: str
) -> None:  # type: ignore[no-untyped-def]
    extra = [f"--{k.replace('_', '-')}={v}" for k, v in overrides.items()]
    engine = sim_engines(profile="llama3-8b-h100", time_scale=2.0, extra_args=extra)
    expected = analytic_capacity(
        get_profile("llama3-8b-h100").with_overrides(**overrides), CONTEXT, OUTPUT
    )
    assert expected.bound == bound
    out, plot = tmp_path / "profile.yaml", tmp_path / "knee.png"
    cmd = [
        sys.executable, "-m", "kvgate", "calibrate", "--target", engine.url,
        "--engine-type", "sim", "--deployment", "h100x1", "--context", str(CONTEXT),
        "--output-tokens", str(OUTPUT), "--start", "2", "--growth", "1.4", "--refine", "2",
        "--max-seconds", "200", "--out", str(out), "--plot", str(plot),
        "--store", etcd_server.url,
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stderr
    profile = CapacityProfile.from_dict(yaml.safe_load(out.read_text()))
    assert profile.model_version == "meta-llama/Llama-3.1-8B-Instruct"
    assert (profile.deployment, profile.context) == ("h100x1", CONTEXT)
    ratio = profile.capacity_runtime_tokens / expected.runtime_tokens
    assert 0.85 <= ratio <= 1.15, (profile, expected, done.stderr)
    assert abs(profile.knee_concurrency - expected.concurrency) <= 0.15 * expected.concurrency + 1
    assert profile.details["latency_source"] == "engine"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    async def stored() -> str | None:
        store = open_store(etcd_server.url)
        try:
            return await store.get(profile.key)
        finally:
            await store.close()

    text = asyncio.run(stored())
    assert text is not None and CapacityProfile.from_json(text) == profile


def test_no_knee_within_the_bounds_exits_1_and_writes_nothing(sim_engines, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    engine = sim_engines(profile="llama3-8b-h100", time_scale=4.0)
    out = tmp_path / "p.yaml"
    cmd = [
        sys.executable, "-m", "kvgate", "calibrate", "--target", engine.url,
        "--engine-type", "sim", "--context", "256", "--output-tokens", "16",
        "--max-concurrency", "3", "--growth", "2", "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "no knee up to concurrency" in done.stderr
    assert not out.exists()


def test_an_engine_that_does_not_answer_exits_1(tmp_path: Path) -> None:
    from tests.fixtures.servers import free_port

    out = tmp_path / "p.yaml"
    cmd = [
        sys.executable, "-m", "kvgate", "calibrate", "--target",
        f"http://127.0.0.1:{free_port()}", "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "did not answer" in done.stderr
    assert not out.exists()
