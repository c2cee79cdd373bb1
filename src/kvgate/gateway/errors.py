"""OpenAI-style error bodies: every request that enters the gateway ends in one of these."""

from __future__ import annotations

import asyncio
import json
import logging
import zlib
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError
from prometheus_client import CollectorRegistry, Counter
from yarl import URL

from kvgate.store.base import StoreUnavailable

log = logging.getLogger("kvgate.gateway")

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    417: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
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

    def body(self) -> dict[str, dict[str, str | None]]:
        return {
            "error": {
                "message": self.message,
                "type": self.type_ or _TYPE_BY_STATUS.get(self.status, "server_error"),
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> web.Response:
        return web.Response(
            status=self.status,
            text=json.dumps(self.body()),
            content_type="application/json",
            headers=self.headers,
        )


def sse_error_event(
    message: str, *, type_: str = "upstream_error", code: str | None = None
) -> bytes:
    body = ApiError(502, message, type_=type_, code=code).body()
    return b"data: " + json.dumps(body).encode() + b"\n\ndata: [DONE]\n\n"


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# Exceptions whose cause is what the client sent (its bytes, headers or text): a 400.
# Raised by aiohttp while reading the body (a broken Content-Encoding, a bad chunk), or
# by code that met client text it cannot handle; body.py should have caught them first.
CLIENT_INPUT_ERRORS: tuple[type[BaseException], ...] = (
    HttpProcessingError,
    RequestPayloadError,
    UnicodeError,
    RecursionError,
    zlib.error,
)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return exc.response()
    except web.HTTPRequestEntityTooLarge as exc:
        return ApiError(
            413, f"request body too large (limit {exc.text or 'exceeded'})", code="body_too_large"
        ).response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status)
        message = (
            exc.reason if exc.status != 404 else f"no route for {request.method} {request.path}"
        )
        return ApiError(exc.status, message, code=code, headers=_allow_header(exc)).response()
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        return unexpected_error_response(request, exc)


def unexpected_error_response(request: web.Request, exc: BaseException) -> web.Response:
    """The last resort: an OpenAI-style answer that names no internals.

    Client-caused exceptions become 400; an upstream client error that escaped the proxy
    becomes 502; the store being down becomes 503; anything else is the gateway's own bug
    (500, logged with its traceback). ``kvgate_unexpected_errors_total`` counts each.
    """
    kind, status = classify_exception(exc)
    _count_unexpected(request, kind)
    if status == 400:
        log.warning(
            "client input rejected late in %s %s: %s",
            request.method,
            request.path,
            type(exc).__name__,
        )
        return ApiError(
            400, "the request could not be processed as sent", code="bad_request"
        ).response()
    if status == 502:
        log.warning("upstream error escaped in %s %s: %r", request.method, request.path, exc)
        return ApiError(502, "upstream engine error", code="upstream_error").response()
    if status == 503:
        log.warning("store unavailable in %s %s: %s", request.method, request.path, exc)
        return ApiError(
            503,
            "state store unavailable; retry later",
            code="store_unavailable",
            headers={"Retry-After": "1"},
        ).response()
    log.error("unhandled error in %s %s", request.method, request.path, exc_info=exc)
    return ApiError(
        500, "internal gateway error", type_="server_error", code="internal_error"
    ).response()


def classify_exception(exc: BaseException) -> tuple[str, int]:
    """(kind, status) for an exception no handler turned into an ApiError."""
    if isinstance(exc, CLIENT_INPUT_ERRORS):
        return "client_input", 400
    if isinstance(exc, StoreUnavailable):
        return "store_unavailable", 503
    if isinstance(exc, aiohttp.ClientError | TimeoutError):
        return "upstream", 502
    return "internal", 500


UNEXPECTED_ERRORS: web.AppKey[Counter] = web.AppKey("kvgate_unexpected_errors", Counter)


def _count_unexpected(request: web.Request, kind: str) -> None:
    counter = request.app.get(UNEXPECTED_ERRORS)
    if counter is not None:
        counter.labels(kind).inc()


async def expect_handler(request: web.Request) -> web.StreamResponse | None:
    """``Expect: 100-continue`` as aiohttp does it; any other value is an OpenAI-style 417.

    aiohttp's default handler echoes the header into a text body and fails with a 500
    when the value holds bytes that are not UTF-8; it also runs before any middleware.
    """
    expect = request.headers.get("Expect", "")
    if expect.lower() == "100-continue":
        if request.version == aiohttp.HttpVersion11:
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0
        return None
    return ApiError(
        417,
        f"unsupported Expect header {ascii(expect)[:80]}; only 100-continue is",
        code="expectation_failed",
        param="Expect",
    ).response()


async def _unrouted(request: web.Request) -> web.StreamResponse:
    """The last route: 405 where the path exists with other methods, else 404."""
    allowed: set[str] = set()
    for resource in request.app.router.resources():
        if isinstance(resource, _Unrouted):
            continue
        _, methods = await resource.resolve(request)
        allowed |= methods
    if allowed:
        raise web.HTTPMethodNotAllowed(request.method, sorted(allowed))
    raise web.HTTPNotFound()


class _Unrouted(web.AbstractResource):
    """Matches every request no other resource took; labelled "unmatched" in metrics."""

    def __init__(self) -> None:
        super().__init__(name=None)
        self._route = web.ResourceRoute("*", _unrouted, self, expect_handler=expect_handler)
        # the router files a resource under its canonical path's first segment; as "/"
        # it is tried for every path, after every more specific resource
        self.indexed_as_root = True

    @property
    def canonical(self) -> str:
        return "/" if self.indexed_as_root else "unmatched"

    def url_for(self, **kwargs: str) -> URL:
        raise RuntimeError("the unrouted resource has no URL")

    def add_prefix(self, prefix: str) -> None:
        return None

    def get_info(self) -> Any:
        return {}

    def raw_match(self, path: str) -> bool:
        return False

    async def resolve(self, request: web.Request) -> tuple[web.UrlMappingMatchInfo, set[str]]:
        return web.UrlMappingMatchInfo({}, self._route), {"*"}

    def __len__(self) -> int:
        return 1

    def __iter__(self) -> Iterator[web.AbstractRoute]:
        return iter([self._route])


def guard_edges(app: web.Application, registry: CollectorRegistry) -> None:
    """Call after all routes are added. Every route answers an odd ``Expect`` header with
    an OpenAI-style 417, and a request no route takes is answered by a last resource
    inside the middlewares (aiohttp runs the expect handler before any middleware, and
    its default one fails with a 500 on a non-UTF-8 value). Also registers
    ``kvgate_unexpected_errors_total`` (see ``unexpected_error_response``)."""
    for route in app.router.routes():
        route._expect_handler = expect_handler  # type: ignore[attr-defined]  # no public setter
    app[UNEXPECTED_ERRORS] = Counter(
        "kvgate_unexpected_errors",
        "Exceptions no handler turned into an API error, by kind "
        "(client_input → 400, upstream → 502, store_unavailable → 503, internal → 500)",
        ["kind"],
        registry=registry,
    )
    unrouted = _Unrouted()
    app.router.register_resource(unrouted)
    unrouted.indexed_as_root = False  # from here on it reports itself as "unmatched"


def _allow_header(exc: web.HTTPException) -> dict[str, str]:
    allow = exc.headers.get("Allow")
    return {"Allow": allow} if allow else {}
