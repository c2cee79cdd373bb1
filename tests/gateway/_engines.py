"""How gateway tests get simulated engines (one place to adapt to the engine fixture)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.fixtures.engines import start_engine_process

FAST = ("--time-scale", "0.01")  # engines run 100x faster than the modelled hardware


@contextmanager
def engines(n: int, *extra_args: str) -> Iterator[list[Any]]:
    started: list[Any] = []
    try:
        for _ in range(n):
            started.append(start_engine_process(extra_args=[*FAST, *extra_args]))
        yield started
    finally:
        for engine in started:
            engine.stop()
