"""OpenAI-style error bodies: every request that enters the gateway ends in one of these."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

log = logging.getLogger("kvgate.gateway")

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


def error_body(
    message: str,
    *,
    status: int,
    type_: str | None = None,
    param: str | None = None,
    code: str | None = None,
) -> dict[str, dict[str, str | None]]:
    return {
        "error": {
            "message": message,
            "type": type_ or _TYPE_BY_STATUS.get(status, "server_error"),
            "param": param,
            "code": code,
        }
    }


class ApiError(Exception):
    """Raised anywhere in a handler; the middleware turns it into an OpenAI error response."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type_ = type_
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def response(self) -> web.Response:
        return error_response(
            self.status,
            self.message,
            type_=self.type_,
            param=self.param,
            code=self.code,
            headers=self.headers,
        )


def error_response(
    status: int,
    message: str,
    *,
    type_: str | None = None,
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    return web.Response(
        status=status,
        text=json.dumps(error_body(message, status=status, type_=type_, param=param, code=code)),
        content_type="application/json",
        headers=dict(headers or {}),
    )


def sse_error_event(
    message: str, *, type_: str = "upstream_error", code: str | None = None
) -> bytes:
    body = error_body(message, status=502, type_=type_, code=code)
    return b"data: " + json.dumps(body).encode() + b"\n\ndata: [DONE]\n\n"


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return exc.response()
    except web.HTTPRequestEntityTooLarge as exc:
        return error_response(
            413, f"request body too large (limit {exc.text or 'exceeded'})", code="body_too_large"
        )
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status)
        message = (
            exc.reason if exc.status != 404 else f"no route for {request.method} {request.path}"
        )
        return error_response(exc.status, message, code=code, headers=_allow_header(exc))
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(500, "internal gateway error", type_="server_error")


def _allow_header(exc: web.HTTPException) -> dict[str, str]:
    allow = exc.headers.get("Allow")
    return {"Allow": allow} if allow else {}
