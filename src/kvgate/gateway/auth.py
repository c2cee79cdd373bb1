"""Who is calling: tenant API keys for /v1, the admin token for /admin and /dashboard.

Admin rule: with ``auth.admin_token`` set, admin endpoints need ``Authorization: Bearer
<token>`` (the dashboard page may pass ``?token=``). Without a token they answer only when
the gateway is bound to a loopback address; on any other bind they are refused (403), so
an unconfigured gateway never exposes its admin API to the network.
"""

from __future__ import annotations

import hmac
import ipaddress

from aiohttp import web

from kvgate.gateway.errors import ApiError


def bearer_token(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.headers.get("api-key") or None  # Azure-style clients


def is_loopback_host(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_admin(
    request: web.Request, admin_token: str | None, bound_host: str, *, allow_query: bool = False
) -> None:
    """Raise ApiError unless the caller may use the admin API."""
    if admin_token is None:
        if is_loopback_host(bound_host):
            return
        raise ApiError(
            403,
            "admin API disabled: set auth.admin_token (or bind the gateway to loopback)",
            code="admin_disabled",
        )
    given = bearer_token(request)
    if given is None and allow_query:
        given = request.query.get("token")
    if given is None or not hmac.compare_digest(given.encode(), admin_token.encode()):
        raise ApiError(
            401,
            "admin token missing or wrong (Authorization: Bearer <admin token>)",
            code="invalid_admin_token",
            headers={"WWW-Authenticate": "Bearer"},
        )
