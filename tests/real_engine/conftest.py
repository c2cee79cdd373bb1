"""Fixtures for tests against real llama.cpp servers (``-m real_engine``).

``llama_servers(n)`` starts ``n`` llama-server processes (one thread each) and stops them
at teardown. Tests skip, saying why, only when the binary or model is not installed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from kvgate.procs.llama import LlamaServer, missing_reason, start_llama_server


@pytest.fixture
def llama_servers() -> Iterator[Callable[..., list[LlamaServer]]]:
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    started: list[LlamaServer] = []

    def start(n: int = 1, **kwargs: object) -> list[LlamaServer]:
        for _ in range(n):
            started.append(start_llama_server(**kwargs))  # type: ignore[arg-type]
        return started[-n:]

    yield start
    for server in started:
        server.stop()
