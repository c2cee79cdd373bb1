"""How gateway tests get simulated engines (one place to adapt to the engine fixture)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tests.fixtures.engines import EngineProcess, start_engine_process

MODEL = "sim"
TIME_SCALE = 50.0  # simulated time runs 50x faster than the modelled hardware


@dataclass
class Engine:
    """One engine URL and the process hosting it (shared when started together)."""

    url: str
    process: EngineProcess

    def kill(self) -> None:
        self.process.kill()

    def stop(self) -> None:
        self.process.stop()


@contextmanager
def engines(n: int, *, separate: bool = True, **kwargs: object) -> Iterator[list[Engine]]:
    """``n`` engines: one process each (``separate``, so each can be killed) or one for all."""
    processes: list[EngineProcess] = []
    options = {"time_scale": TIME_SCALE, "model": MODEL, **kwargs}
    try:
        if separate:
            for _ in range(n):
                processes.append(start_engine_process(**options))  # type: ignore[arg-type]
            yield [Engine(p.url, p) for p in processes]
        else:
            processes.append(start_engine_process(count=n, **options))  # type: ignore[arg-type]
            yield [Engine(u, processes[0]) for u in processes[0].urls]
    finally:
        for p in processes:
            p.stop()
