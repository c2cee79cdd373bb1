"""Admin API and dashboard: nodes, flags, summary, config (see auth.py for the token rule)."""

from __future__ import annotations

import json
import time
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from kvgate.dashboard import INDEX_HTML
from kvgate.flags import UnknownFlag, unknown_flags, unknown_flags_message
from kvgate.gateway.auth import check_admin
from kvgate.gateway.body import read_json_object
from kvgate.gateway.config import NodeConfig, format_validation_error
from kvgate.gateway.errors import ApiError
from kvgate.gateway.gateway import GATEWAY, Gateway
from kvgate.gateway.summary import build_summary, node_rows
from kvgate.store.base import StoreUnavailable
from kvgate.store.keys import flag_key
from kvgate.types import NodeState


def add_routes(app: web.Application) -> None:
    app.router.add_get("/admin/nodes", list_nodes)
    app.router.add_post("/admin/nodes", add_node)
    app.router.add_delete("/admin/nodes/{node_id}", remove_node)
    app.router.add_post("/admin/nodes/{node_id}/state", set_node_state)
    app.router.add_get("/admin/flags", get_flags)
    app.router.add_post("/admin/flags", set_flags)
    app.router.add_get("/admin/summary", summary)
    app.router.add_get("/admin/config", get_config)
    app.router.add_get("/dashboard", dashboard)


def _admin(request: web.Request, *, allow_query: bool = False) -> Gateway:
    gateway = request.app[GATEWAY]
    check_admin(
        request,
        gateway.config.auth.admin_token,
        gateway.config.server.host,
        allow_query=allow_query,
    )
    return gateway


def _known_node(gateway: Gateway, request: web.Request) -> str:
    node_id = request.match_info["node_id"]
    if node_id not in gateway.specs:
        raise ApiError(404, f"no node {node_id!r}", code="node_not_found")
    return node_id


async def _json_object(request: web.Request) -> dict[str, Any]:
    body, _ = await read_json_object(request, request.app[GATEWAY].config.server.max_body_bytes)
    return body


async def list_nodes(request: web.Request) -> web.Response:
    gateway = _admin(request)
    return web.json_response({"nodes": node_rows(gateway)})


async def add_node(request: web.Request) -> web.Response:
    gateway = _admin(request)
    body = await _json_object(request)
    try:
        node = NodeConfig.model_validate(body)
    except ValidationError as exc:
        raise ApiError(400, format_validation_error(exc), code="invalid_node") from None
    if node.id in gateway.specs:
        raise ApiError(409, f"node {node.id!r} already exists", param="id", code="node_exists")
    model = await gateway.resolve_model(node.url, node.model)
    gateway.add_node(node.spec(model), "admin")
    return web.json_response({"added": node.id, "model": model}, status=201)


async def remove_node(request: web.Request) -> web.Response:
    gateway = _admin(request)
    node_id = _known_node(gateway, request)
    gateway.remove_node(node_id)
    return web.json_response({"removed": node_id})


async def set_node_state(request: web.Request) -> web.Response:
    gateway = _admin(request)
    node_id = _known_node(gateway, request)
    body = await _json_object(request)
    try:
        state = NodeState(str(body.get("state")))
    except ValueError:
        known = ", ".join(s.value for s in NodeState)
        raise ApiError(
            400, f"state must be one of {known}", param="state", code="invalid_state"
        ) from None
    gateway.nodes.set_state(node_id, state)
    return web.json_response({"node_id": node_id, "state": state.value})


async def get_flags(request: web.Request) -> web.Response:
    gateway = _admin(request)
    return web.json_response({"flags": gateway.flags.as_dict()})


async def set_flags(request: web.Request) -> web.Response:
    gateway = _admin(request)
    body = await _json_object(request)
    if unknown := unknown_flags(body):
        raise ApiError(400, unknown_flags_message(unknown), param=unknown[0], code="unknown_flag")
    for name, value in body.items():
        if not isinstance(value, bool):
            raise ApiError(
                400, f"flag {name!r} must be true or false", param=name, code="invalid_value"
            )
    # the store first: a switch that cannot reach the store is refused (503), never
    # applied here only, where replicas sharing the store would silently disagree
    written: list[str] = []
    for name, value in body.items():
        try:
            await gateway.store.put(flag_key(name), "on" if value else "off")
        except (StoreUnavailable, ConnectionError, OSError):
            gateway.metrics.registry_events.labels("flag_write_refused").inc()
            for done in written:  # already in the store: every replica applies them
                gateway.flags.set(done, body[done])
            raise ApiError(
                503,
                f"state store unavailable: flag {name!r} not written"
                + (f" (written: {', '.join(written)})" if written else "")
                + "; nothing else changed, retry later",
                code="store_unavailable",
                param=name,
                headers={"Retry-After": "1"},
            ) from None
        written.append(name)
    for name, value in body.items():
        try:
            gateway.flags.set(name, value)
        except UnknownFlag as exc:  # pragma: no cover - checked above
            raise ApiError(400, str(exc), param=name, code="unknown_flag") from None
    return web.json_response({"flags": gateway.flags.as_dict()})


async def summary(request: web.Request) -> web.Response:
    gateway = _admin(request)
    return web.json_response(build_summary(gateway), dumps=_dumps)


async def get_config(request: web.Request) -> web.Response:
    gateway = _admin(request)
    config = gateway.config.model_dump(mode="json")
    if config.get("auth", {}).get("admin_token"):
        config["auth"]["admin_token"] = "***"
    for tenant in config.get("admission", {}).get("tenants", []) or []:
        if tenant.get("api_keys"):
            tenant["api_keys"] = ["***"] * len(tenant["api_keys"])
    return web.json_response(
        {"config": config, "flags": gateway.flags.as_dict(), "fetched_at": time.time()}
    )


async def dashboard(request: web.Request) -> web.StreamResponse:
    _admin(request, allow_query=True)
    if not INDEX_HTML.is_file():
        raise ApiError(404, "dashboard not installed", code="not_found")
    return web.FileResponse(INDEX_HTML, headers={"Cache-Control": "no-cache"})


def _dumps(value: Any) -> str:
    return json.dumps(value, allow_nan=False, default=str)
