"""OpenAI-compatible endpoints: parse → auth → route request → admission → proxy.

Every admitted (or degraded) request releases its admission exactly once, whatever
happens afterwards (try/finally), including a client that disconnects mid-stream.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kvgate.admission.tenants import PriorityNotAllowed
from kvgate.gateway.app import GATEWAY, Gateway
from kvgate.gateway.auth import bearer_token
from kvgate.gateway.errors import ApiError
from kvgate.gateway.logs import request_log
from kvgate.gateway.proxy import Call
from kvgate.prompts import PromptError
from kvgate.routing import build_route_request
from kvgate.types import AdmissionKind, AdmissionRequest, AdmissionResult, RouteRequest

TENANT_HEADER = "X-KVGate-Tenant"
PRIORITY_HEADER = "X-KVGate-Priority"
CLASS_HEADER = "X-KVGate-Class"
DEFAULT_POOL = "default"
ENDPOINT_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/jobs/{job_id}", get_job)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)


async def health(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    return web.json_response(
        {"status": "ok", "gateway": gateway.config.gateway_id, "nodes": len(gateway.specs)}
    )


async def metrics(request: web.Request) -> web.Response:
    registry = request.app[GATEWAY].registry
    return web.Response(
        body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )


async def list_models(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    identify_tenant(gateway, request)
    data = [
        {"id": m, "object": "model", "created": 0, "owned_by": "kvgate"} for m in gateway.models()
    ]
    return web.json_response({"object": "list", "data": data})


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await generate(request, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    return await generate(request, "completions")


# -- request parsing --------------------------------------------------------------------
async def read_json_body(request: web.Request, limit: int) -> tuple[dict[str, Any], bytes]:
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(
            413,
            f"request body is {request.content_length} bytes; the limit is {limit}",
            code="body_too_large",
        )
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(
            413, f"request body exceeds the limit of {limit} bytes", code="body_too_large"
        ) from None
    if not raw:
        raise ApiError(400, "request body is empty; send a JSON object", code="invalid_json")
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object", code="invalid_json")
    return body, raw


def validate_body(body: dict[str, Any], endpoint: str) -> None:
    required = "messages" if endpoint == "chat" else "prompt"
    if required not in body:
        raise ApiError(
            400, f"missing required field '{required}'", param=required, code="missing_field"
        )
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, "'model' must be a string", param="model", code="invalid_type")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise ApiError(400, "'stream' must be a boolean", param="stream", code="invalid_type")
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < 1
        ):
            raise ApiError(
                400, f"'{name}' must be a positive integer", param=name, code="invalid_value"
            )


def _prompt_error(exc: PromptError) -> ApiError:
    text = str(exc)
    param = text.split(" ", 1)[0] if text else None
    return ApiError(400, text, param=param, code="invalid_prompt")


def identify_tenant(gateway: Gateway, request: web.Request) -> Any:
    """The caller's TenantConfig; 401 for an unknown key when auth is on."""
    directory = gateway.tenants
    key = bearer_token(request) if directory.auth_enabled else None
    tenant = directory.authenticate(key)
    if tenant is None:
        raise ApiError(
            401,
            "invalid or missing API key (Authorization: Bearer <key>)",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    claimed = request.headers.get(TENANT_HEADER)
    if claimed is not None and claimed != tenant.name:
        raise ApiError(
            403,
            f"{TENANT_HEADER} {claimed!r} does not match the tenant of the API key",
            param=TENANT_HEADER,
            code="tenant_mismatch",
        )
    return tenant


def requested_priority(request: web.Request, body: dict[str, Any]) -> int | None:
    header = request.headers.get(PRIORITY_HEADER)
    if header is not None:
        try:
            return int(header)
        except ValueError:
            raise ApiError(
                400,
                f"{PRIORITY_HEADER} must be an integer",
                param=PRIORITY_HEADER,
                code="invalid_value",
            ) from None
    value = body.get("priority")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ApiError(400, "'priority' must be an integer", param="priority", code="invalid_type")
    return value


def _model_for(gateway: Gateway, body: dict[str, Any]) -> str:
    models = gateway.models()
    model = body.get("model")
    if not models:
        raise ApiError(503, "no node is configured", code="no_node_available")
    if model is None:
        return models[0]
    if model not in models and "default" not in models:
        raise ApiError(
            404,
            f"the model {model!r} is not served here; see /v1/models",
            param="model",
            code="model_not_found",
        )
    return model  # type: ignore[no-any-return]


# -- the request path -------------------------------------------------------------------
async def generate(request: web.Request, endpoint: str) -> web.StreamResponse:
    gateway = request.app[GATEWAY]
    started = time.perf_counter()
    request_id = request.headers.get("X-Request-Id") or f"req-{uuid.uuid4().hex[:16]}"
    entry = request_log(request)
    entry.request_id = request_id
    body, raw = await read_json_body(request, gateway.config.server.max_body_bytes)
    validate_body(body, endpoint)
    tenant = identify_tenant(gateway, request)
    entry.tenant = tenant.name
    try:
        priority = gateway.tenants.resolve_priority(tenant, requested_priority(request, body))
    except PriorityNotAllowed as exc:
        raise ApiError(403, str(exc), param=PRIORITY_HEADER, code="priority_not_allowed") from None
    model = _model_for(gateway, body)
    try:
        route = build_route_request(
            body,
            endpoint=endpoint,
            headers=request.headers,
            request_id=request_id,
            tenant=tenant.name,
            priority=priority,
            config=gateway.config.routing.route_key,
        )
    except PromptError as exc:
        raise _prompt_error(exc) from None
    route.model = model

    wants_async = "respond-async" in request.headers.get("Prefer", "").lower()
    priority_class = request.headers.get(CLASS_HEADER) or tenant.default_class
    result = await gateway.admission.admit(
        AdmissionRequest(
            request_id=request_id,
            tenant=tenant.name,
            priority_class=priority_class,
            prompt_tokens=route.prompt_tokens,
            max_tokens=route.max_tokens,
            wants_async=wants_async,
        )
    )
    entry.admission = result.header()
    if result.kind is AdmissionKind.REJECT:
        raise _rejection(result)

    call = Call(
        request_id=request_id,
        path=ENDPOINT_PATHS[endpoint],
        endpoint=endpoint,
        body=body,
        route=route,
        started=started,
        headers={"X-KVGate-Admission": result.header()},
        raw_body=raw,
    )

    async def progress(generated: int) -> None:
        await gateway.admission.progress(result, generated)

    call.on_progress = progress
    place(gateway, route, result, tenant.priority_min)
    if wants_async or result.degrade_to == "async":
        return start_async_job(gateway, call, result, tenant.name)

    try:
        assert gateway.proxy is not None
        response = await gateway.proxy.forward(call, request)
    finally:
        await gateway.admission.release(result)
        _log_call(entry, call)
    return response


def place(
    gateway: Gateway, route: RouteRequest, result: AdmissionResult, priority_min: int
) -> None:
    """Node pool and priority of an admitted request (the degrade path's placement)."""
    economy = gateway.config.admission.degrade.economy_pool
    if gateway.has_pool(DEFAULT_POOL) and gateway.has_pool(economy):
        route.pool = DEFAULT_POOL  # economy nodes take degraded work only
    if result.kind is AdmissionKind.DEGRADE:
        if result.degrade_to == "economy_pool":
            route.pool = economy
        elif result.degrade_to == "low_priority":
            route.priority = min(route.priority, priority_min)


def _log_call(entry: Any, call: Call) -> None:
    if call.decision is not None:
        entry.node = call.decision.node_id
        entry.reason = call.decision.reason
        entry.expected_cached_tokens = call.decision.expected_cached_tokens
    entry.attempts = call.attempts
    if call.usage is not None:
        entry.cached_tokens = call.usage.cached_tokens


def _rejection(result: AdmissionResult) -> ApiError:
    headers = {"X-KVGate-Admission": result.header()}
    status = result.status if result.status >= 400 else 429
    if result.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(result.retry_after_s)))
    if status == 408:
        message = "request timed out in the admission queue"
    elif status == 503:
        message = "admission unavailable (quota store down); retry later"
    elif status == 413:
        message = "the request needs more runtime tokens than its tenant may ever hold"
    else:
        message = f"over quota ({result.reason}); retry later"
    return ApiError(status, message, code=result.reason, headers=headers)


# -- async jobs (Prefer: respond-async, or the async degrade path) ----------------------
def start_async_job(
    gateway: Gateway, call: Call, result: AdmissionResult, tenant: str
) -> web.Response:
    job_id = gateway.jobs.create(tenant)
    call.body = {**call.body, "stream": False}
    call.raw_body = None
    gateway.spawn(_run_job(gateway, call, result, job_id))
    location = f"/v1/jobs/{job_id}"
    return web.json_response(
        {"id": job_id, "object": "job", "status": "queued", "location": location},
        status=202,
        headers={
            "Location": location,
            "X-Request-Id": call.request_id,
            "X-KVGate-Admission": result.header(),
        },
    )


async def _run_job(gateway: Gateway, call: Call, result: AdmissionResult, job_id: str) -> None:
    status, body = 500, b""
    try:
        assert gateway.proxy is not None
        response = await gateway.proxy.forward(call, None)
        assert isinstance(response, web.Response)
        status, body = response.status, response.body  # type: ignore[assignment]
    except ApiError as exc:
        status, body = exc.status, exc.response().body  # type: ignore[assignment]
    except Exception as exc:  # the job must end with a result, never hang
        error = ApiError(500, f"job failed: {type(exc).__name__}")
        status, body = 500, error.response().body  # type: ignore[assignment]
    finally:
        await gateway.admission.release(result)
        try:
            payload = json.loads(body) if body else None
        except ValueError:
            payload = None
        gateway.jobs.set_result(job_id, status, payload)
        gateway.metrics.async_jobs.labels(str(status)).inc()


async def get_job(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    tenant = identify_tenant(gateway, request)
    job = gateway.jobs.get(request.match_info["job_id"], tenant.name)
    if job is None:
        raise ApiError(
            404, "no such job (unknown, expired, or another tenant's)", code="job_not_found"
        )
    if job.status is None:
        return web.json_response(
            {"id": job.job_id, "object": "job", "status": "pending"},
            status=202,
            headers={"Retry-After": "1"},
        )
    return web.json_response(job.body, status=job.status)
