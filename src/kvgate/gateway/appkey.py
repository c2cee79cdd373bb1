"""The key under which an aiohttp app holds its ``Gateway`` (``app[GATEWAY]``).

A module of its own so that modules the ``Gateway`` itself imports (errors, proxy) can
reach the gateway of a request without importing it back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from kvgate.gateway.gateway import Gateway

GATEWAY: web.AppKey[Gateway] = web.AppKey("kvgate_gateway")
