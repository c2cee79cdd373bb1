"""The key under which an aiohttp app holds its ``Gateway`` (``app[GATEWAY]``), and the
cleanup context that starts and stops it with the app.

A module of its own so that modules the ``Gateway`` itself imports (errors, proxy) can
reach the gateway of a request without importing it back.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol

from aiohttp import web

if TYPE_CHECKING:
    from kvgate.gateway.gateway import Gateway

GATEWAY: web.AppKey[Gateway] = web.AppKey("kvgate_gateway")


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
