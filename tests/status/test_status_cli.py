"""``kvgate status`` against a real gateway with real simulated engines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from kvgate.procs.ports import free_port
from tests.fixtures.gateway import GatewayProcess, admin_gateway, chat_once

ADMIN_TOKEN = "status-admin-token"
TENANTS = [
    {"name": "gold", "api_keys": ["k-gold"], "guaranteed": 6000, "weight": 2, "hard_cap": 12000},
    {"name": "bronze", "api_keys": ["k-bronze"], "guaranteed": 1000, "weight": 1},
]


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    with admin_gateway(
        engines=2, node_prefix="sim-", tenants=TENANTS, admin_token=ADMIN_TOKEN
    ) as gw:
        chat_once(gw.url, "k-gold")
        yield gw


def _status(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvgate", "status", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_table_shows_every_node_and_tenant(gateway: GatewayProcess) -> None:
    result = _status("--gateway", gateway.url, "--admin-token", ADMIN_TOKEN)
    assert result.returncode == 0, result.stderr
    for name in ("sim-0", "sim-1", "gold", "bronze", "Nodes", "Tenants", "Decisions"):
        assert name in result.stdout
    assert "healthy" in result.stdout or "re-register" in result.stdout


def test_json_is_the_admin_summary(gateway: GatewayProcess) -> None:
    result = _status("--gateway", gateway.url, "--admin-token", ADMIN_TOKEN, "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert sorted(n["node_id"] for n in summary["nodes"]) == ["sim-0", "sim-1"]
    assert {t["name"] for t in summary["tenants"]} >= {"gold", "bronze"}
    assert summary["gateway"]["auth_enabled"] is True
    admits = summary["admission"]["decisions_total"].get("admit", 0)
    # {kind: n}, or {kind: {reason: n}} with the reasons behind each kind
    assert (sum(admits.values()) if isinstance(admits, dict) else admits) >= 1


def test_refused_token_exits_non_zero_with_a_clear_message(gateway: GatewayProcess) -> None:
    result = _status("--gateway", gateway.url, "--admin-token", "wrong")
    assert result.returncode == 1
    assert "admin token refused" in result.stderr
    assert result.stdout == ""
    missing = _status("--gateway", gateway.url)
    assert missing.returncode == 1
    assert "pass --admin-token" in missing.stderr


def test_unreachable_gateway_exits_non_zero() -> None:
    port = free_port()  # free a moment ago: nothing listens there
    result = _status("--gateway", f"http://127.0.0.1:{port}", "--timeout", "2")
    assert result.returncode == 1
    assert "gateway unreachable" in result.stderr
    assert str(port) in result.stderr
