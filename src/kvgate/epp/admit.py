"""A request Envoy holds, as ``kvgate serve`` reads it: tenant, route, flow, admission.

The same steps and helpers as ``kvgate.gateway.handlers`` (body checks, tenant from the
API key, class and priority within what the key allows, model resolution, route key
from the prompt), ending in a pipeline ``Flow`` admitted by the same admission
controller. Every refusal is an ``ApiError``, answered as serve answers it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from kvgate.admission.config import TenantConfig
from kvgate.admission.queue import QueuedRequest
from kvgate.admission.tenants import NotAllowed
from kvgate.gateway.admission_http import admission_header, not_allowed_error, rejection_error
from kvgate.gateway.body import ACCEPTED_ENCODINGS, _decode, parse_json_object, validate_generation
from kvgate.gateway.errors import ApiError
from kvgate.gateway.gateway import Gateway
from kvgate.gateway.handlers import (
    CLASS_HEADER,
    ENDPOINT_PATHS,
    _check_served,
    _model_for,
    generation_route,
    identify_tenant,
    requested_priority,
)
from kvgate.gateway.surface import SURFACE_KINDS, input_tokens, surface_route
from kvgate.gateway.usage import client_wants_usage, with_usage_requested
from kvgate.pipeline import Flow
from kvgate.types import AdmissionKind, AdmissionRequest, AdmissionResult

# request path → request kind: chat and completions, and the non-generation surfaces
ENDPOINTS = {path: endpoint for endpoint, path in ENDPOINT_PATHS.items()} | {
    path: surface.kind for surface in SURFACE_KINDS for path in surface.paths
}
_IDS = random.Random()


@dataclass(frozen=True, slots=True)
class _Headers:
    """What the handlers' tenant and priority helpers read of a request: its headers."""

    headers: CIMultiDictProxy[str]


def as_request(headers: Mapping[str, str]) -> web.Request:
    """Envoy's request headers where a handler helper takes an aiohttp request."""
    return cast(web.Request, _Headers(CIMultiDictProxy(CIMultiDict(headers))))


def request_id(headers: Mapping[str, str]) -> str:
    return headers.get("x-request-id") or f"req-{_IDS.getrandbits(64):016x}"


def authenticate(gateway: Gateway, headers: Mapping[str, str]) -> TenantConfig:
    """The caller's tenant (401 unknown key, 403 a tenant header the key does not match)."""
    return cast(TenantConfig, identify_tenant(gateway, as_request(headers)))


def decode_body(raw: bytes, headers: Mapping[str, str], limit: int) -> tuple[bytes, bool]:
    """(the body without its Content-Encoding, whether it had one), as serve reads it:
    415 for a coding other than gzip/deflate/identity, 400 for bytes that do not decode."""
    names = [n.strip().lower() for n in headers.get("content-encoding", "").split(",")]
    names = [n for n in names if n]
    for name in names:
        if name not in ACCEPTED_ENCODINGS:
            raise ApiError(
                415,
                f"unsupported Content-Encoding {name!r}; use gzip, deflate or none",
                param="Content-Encoding",
                code="unsupported_encoding",
            )
    codings = [n for n in names if n != "identity"]
    for name in reversed(codings):
        raw = _decode(raw, name, limit)
    return raw, bool(codings)


@dataclass(slots=True)
class Admitted:
    """A request the pipeline let in: its flow and the bytes Envoy sends upstream."""

    flow: Flow
    result: AdmissionResult
    body: bytes
    stream: bool
    strip_usage: bool  # usage was added for kvgate's own accounting: the client gets none


def start_flow(
    gateway: Gateway,
    tenant: TenantConfig,
    headers: Mapping[str, str],
    endpoint: str,
    path: str,
    raw: bytes,
    rid: str,
) -> tuple[Flow, dict[str, Any], bool]:
    """Parse and check the body, build the route and start the request's flow:
    (flow, the body to send, whether it differs from the client's bytes)."""
    body = parse_json_object(raw)
    generation = endpoint in ENDPOINT_PATHS
    surface_tokens = 0
    if generation:
        validate_generation(body, endpoint)
    else:
        surface_tokens = input_tokens(endpoint, body)
    request = as_request(headers)
    try:
        priority = gateway.tenants.resolve_priority(tenant, requested_priority(request, body))
        priority_class = gateway.tenants.resolve_class(tenant, headers.get(CLASS_HEADER.lower()))
    except NotAllowed as exc:
        raise not_allowed_error(exc) from None
    model = _model_for(gateway, body)
    if not generation:
        _check_served(gateway, endpoint, path, model)
        route = surface_route(
            endpoint,
            request_id=rid,
            model=model,
            prompt_tokens=surface_tokens,
            tenant=tenant.name,
            priority=priority,
        )
    else:
        route = generation_route(
            gateway, body, endpoint, request.headers, rid, tenant.name, priority, model
        )
    changed = body.get("model") != model
    if changed:  # "default" (or none) names the served model upstream
        body = {**body, "model": model}
    # a non-generation request holds its input only: no decode is reserved
    client_bound = (
        (body.get("max_completion_tokens") or body.get("max_tokens")) if generation else 0
    )
    flow = gateway.pipeline.start(
        route,
        AdmissionRequest(
            request_id=rid,
            tenant=tenant.name,
            priority_class=priority_class,
            prompt_tokens=route.prompt_tokens,
            max_tokens=client_bound,
            wants_async=False,
            model=model,
            stream=generation and body.get("stream") is True,
        ),
        priority_min=tenant.priority_min,
    )
    return flow, body, changed


async def admit(
    gateway: Gateway, flow: Flow, body: dict[str, Any], raw: bytes, changed: bool
) -> Admitted:
    """Admission's answer (it may wait in the queue); ApiError for a rejection."""
    result = await gateway.pipeline.admit(flow)
    if flow.run_async and isinstance(result.ticket, QueuedRequest):
        # degraded to async work: through Envoy it waits in the queue for its turn and is
        # then answered on this stream (no job: the client's connection is still open)
        result = await gateway.admission.until_admitted(result)
        gateway.pipeline.accept(flow, result)
    if result.kind is AdmissionKind.REJECT:
        raise rejection_error(result)
    assert flow.admission_request is not None
    if flow.admission_request.max_tokens is None and result.output_bound:
        # the reservation covers this many output tokens: the engine must not exceed it
        body, changed = {**body, "max_tokens": result.output_bound}, True
    stream = body.get("stream") is True
    strip_usage = False
    if stream and not client_wants_usage(body):
        # usage (cached tokens, exact counts) feeds hit feedback; the client never sees it
        body, changed, strip_usage = with_usage_requested(body), True, True
    out = json.dumps(body, ensure_ascii=False).encode() if changed else raw
    return Admitted(flow, result, out, stream, strip_usage)


def admission_headers(flow: Flow) -> dict[str, str]:
    """The X-KVGate-* headers known about a flow at this point."""
    headers: dict[str, str] = {}
    if flow.admission is not None:
        headers["X-KVGate-Admission"] = admission_header(flow.admission)
    if flow.decision is not None:
        headers["X-KVGate-Node"] = flow.decision.node_id
        headers["X-KVGate-Route-Reason"] = flow.decision.reason
        headers["X-KVGate-Expected-Cached-Tokens"] = str(flow.decision.expected_cached_tokens)
    return headers
