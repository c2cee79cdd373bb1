"""Small asyncio helpers the servers and background loops share."""

from __future__ import annotations

import asyncio
import contextlib
import signal
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
