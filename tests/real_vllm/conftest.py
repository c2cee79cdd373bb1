"""Fixtures for tests against real vLLM engines (``-m real_vllm``).

``vllm_engine`` is one vLLM CPU server (``kvgate.procs.vllm``: the venv and tiny model dir
that scripts/install-vllm.sh made, random weights, block size 32, prefix caching), started
once per module on a loopback port and stopped after it. Start-up takes 60–90 s. Tests skip,
saying why, only when the venv or the model dir is not installed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvgate.procs.vllm import VllmServer, missing_reason, start_vllm_servers

pytestmark = pytest.mark.real_vllm


@pytest.fixture(scope="module")
def vllm_engine() -> Iterator[VllmServer]:
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    (server,) = start_vllm_servers(1, ready_timeout=360.0)
    try:
        yield server
    finally:
        server.stop()
