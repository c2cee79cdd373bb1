"""The cleanup context that starts and stops an app's gateway with the app, and (re-exported
from ``kvgate.gateway.gateway``, where it is defined beside the class it names) the key
under which an aiohttp app holds its ``Gateway`` (``app[GATEWAY]``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from aiohttp import web

from kvgate.gateway.gateway import GATEWAY


class _Startable(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def start_with_app(app: web.Application, gateway: _Startable) -> None:
    """``gateway`` starts when the app starts up and stops when it cleans up."""

    async def lifecycle(_: web.Application) -> AsyncIterator[None]:
        await gateway.start()
        yield
        await gateway.stop()

    app.cleanup_ctx.append(lifecycle)


__all__ = ["GATEWAY", "start_with_app"]
