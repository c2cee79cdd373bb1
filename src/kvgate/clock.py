"""Injected clocks: one logic, two clocks.

Routing, admission and the engine model never call ``time`` directly; they take a
``Clock``. The live gateway passes ``SystemClock``; the cluster simulator and tests pass
``ManualClock`` and move it forward themselves.
"""

from __future__ import annotations

import time
from collections.abc import Coroutine
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale (only differences are meaningful)."""
        ...


class SystemClock:
    """Real monotonic time."""

    def now(self) -> float:
        return time.monotonic()


class ManualClock:
    """Virtual time, moved only by its owner."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        self._now += seconds

    def set(self, t: float) -> None:
        if t < self._now:
            raise ValueError("a clock cannot go backwards")
        self._now = t


class WouldSuspend(RuntimeError):
    """Raised by ``run_now`` when a coroutine needed real I/O."""


def run_now(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (e.g. a ``MemoryStore`` call) synchronously.

    The store interface is async so Redis and etcd fit behind it; the in-memory store's
    coroutines complete without awaiting anything, so the virtual-time simulator can
    drive the same admission code without an event loop.
    """
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise WouldSuspend("coroutine suspended; run_now only drives non-blocking stores")
