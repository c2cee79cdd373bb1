"""examples/envoy: the Envoy config is the bootstrap kvgate generates, Envoy accepts it,
and the picker's config parses as a gateway config."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from kvgate.epp.bootstrap import bootstrap
from kvgate.gateway.config import load_config, parse_config
from kvgate.procs.envoy import find_envoy

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "envoy"


def test_example_envoy_config_is_the_generated_bootstrap() -> None:
    example = yaml.safe_load((EXAMPLES / "envoy.yaml").read_text())
    assert example == bootstrap(listen_port=8080, picker_port=9002, admin_port=9901)


@pytest.mark.real_envoy
def test_envoy_accepts_the_example_config() -> None:
    envoy = find_envoy()
    assert envoy is not None
    done = subprocess.run(
        [str(envoy), "--mode", "validate", "-c", str(EXAMPLES / "envoy.yaml")],
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_example_picker_config_parses() -> None:
    config = parse_config(load_config(EXAMPLES / "kvgate.yaml"))
    assert [n.id for n in config.nodes] == ["node-a", "node-b"]
