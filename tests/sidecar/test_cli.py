"""``kvgate sidecar`` option validation: bad values are refused with the option's name."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvgate.cli import build_parser
from kvgate.sidecar.cli import build_config

BASE = [
    "sidecar",
    "--engine",
    "http://127.0.0.1:9",
    "--engine-type",
    "sim",
    "--node-id",
    "n1",
    "--store",
    "redis://127.0.0.1:1",
]


def config_for(*extra: str):  # type: ignore[no-untyped-def]
    return build_config(build_parser().parse_args([*BASE, *extra]))


def test_defaults() -> None:
    c = config_for()
    assert c.interval_s == 3.0 and c.ttl_s == 9.0 and c.url == "http://127.0.0.1:9"
    assert c.policy.recover_hold_s == 9.0 and c.policy.unreachable_after_s == 6.0
    c2 = config_for("--interval", "0.5", "--lease-ttl", "2", "--advertise-url", "http://e:1/")
    assert c2.ttl_s == 2.0 and c2.url == "http://e:1"


@pytest.mark.parametrize(
    ("extra", "option"),
    [
        (["--lease-ttl", "1", "--interval", "3"], "--lease-ttl"),
        (["--waiting-low", "9", "--waiting-high", "4"], "--waiting-low"),
        (["--kv-low", "0.99"], "--kv-low"),
        (["--advertise-url", "not-a-url"], "--advertise-url"),
    ],
)
def test_invalid_combinations_name_the_option(extra: list[str], option: str) -> None:
    with pytest.raises(ValueError, match=option):
        config_for(*extra)


def test_the_value_in_an_error_is_echoed_unchanged() -> None:
    with pytest.raises(ValueError) as info:
        config_for("--advertise-url", "ftp://model-pool/")
    assert "--advertise-url" in str(info.value)
    assert "'ftp://model-pool/'" in str(info.value)


def test_cli_exits_2_with_a_message() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kvgate", *BASE, "--engine", "ftp://x", "--log-level", "error"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--engine" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "kvgate", *BASE, "--interval", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "--interval" in proc.stderr
