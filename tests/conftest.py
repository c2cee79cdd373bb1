"""Shared fixtures: real engines, real Redis/etcd servers, real gateways on free ports.

Under pytest-xdist (``scripts/test.sh`` runs ``-n 2 --dist loadgroup``) each test module
goes to one worker as a whole, so module-scoped servers start once. The modules in
``HEAVY_MODULES`` each keep a core busy for tens of seconds (real llama.cpp and vLLM servers,
calibration sweeps, the demo, Chromium) and measure latency or throughput while they do;
they share one group, so they run one after another on one worker, never two at once.
"""

from __future__ import annotations

import pytest

pytest_plugins = [
    "tests.fixtures.engines",
    "tests.fixtures.servers",
    "tests.fixtures.gateway",
]

HEAVY_MODULES = frozenset(
    {
        "tests/real_engine/test_gateway_e2e.py",
        "tests/real_engine/test_llamacpp_live.py",
        "tests/calibrate/test_calibrate_llamacpp.py",
        "tests/calibrate/test_calibrate_sim.py",
        "tests/demo/test_demo_cli.py",
        "tests/dashboard/test_dashboard_browser.py",
        "tests/gateway/test_forgone_dashboard.py",
        "tests/real_vllm/test_vllm_live.py",
    }
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """An ``xdist_group`` for every test: its module's path, or ``heavy``.

    (tryfirst: xdist reads the groups in its own hook of the same name.)
    """
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        module = item.nodeid.split("::", 1)[0]
        group = "heavy" if module in HEAVY_MODULES else module
        item.add_marker(pytest.mark.xdist_group(group))
