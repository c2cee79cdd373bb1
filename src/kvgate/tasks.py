"""Small asyncio helpers the servers and background loops share."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable, Iterable
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel a background task (if any) and wait until it has ended."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM: a server runs until it is set."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def serve_until_signalled(cleanup: Callable[[], Awaitable[object]]) -> None:
    """Wait for SIGINT or SIGTERM, then ``cleanup`` (also when cancelled first)."""
    stop = stop_on_signals()
    try:
        await stop.wait()
    finally:
        await cleanup()


async def cancel_all(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel every task, then wait for each to end. Shutting down, nobody reads how a
    task ended: its cancellation or an error it raised is dropped."""
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
