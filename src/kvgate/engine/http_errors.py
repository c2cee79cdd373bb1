"""OpenAI-style error bodies of the simulated engine."""

from __future__ import annotations

from aiohttp import web


def error_response(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> web.Response:
    err_type = {400: "invalid_request_error", 404: "not_found_error"}.get(status, "server_error")
    body = {"error": {"message": message, "type": err_type, "param": param, "code": code}}
    return web.json_response(body, status=status)
