"""OpenAI-compatible endpoints: parse → auth → route request → the request pipeline.

The handler turns HTTP into a pipeline ``Flow`` (the route built once, with the resolved
model) and the pipeline's outcomes back into HTTP; admission, degrade, routing, retries
and feedback are the pipeline's. Every admitted (or degraded) request releases its
admission exactly once, whatever happens afterwards (try/finally), including a client
that disconnects. Every answer, errors included, carries ``X-Request-Id`` and the
``X-KVGate-*`` headers known by then.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kvgate.admission.tenants import NotAllowed
from kvgate.gateway.admission_http import (
    admission_header,
    not_allowed_error,
    rejection_error,
)
from kvgate.gateway.auth import bearer_token
from kvgate.gateway.body import read_json_object, validate_generation
from kvgate.gateway.errors import ApiError
from kvgate.gateway.gateway import GATEWAY, Gateway
from kvgate.gateway.logs import request_log
from kvgate.gateway.proxy import Call
from kvgate.gateway.responses import (
    OUTPUT_BOUND_FIELD,
    ResponseWatch,
    continued_id,
    node_gone_error,
)
from kvgate.gateway.responses import PATH as RESPONSES_PATH
from kvgate.gateway.responses import route_request as responses_route
from kvgate.gateway.responses import validate as validate_responses
from kvgate.gateway.surface import SURFACE_KINDS, input_tokens, surface_route
from kvgate.pipeline import Flow, UnknownModel, resolve_model
from kvgate.pipeline.pipeline import NODE_GONE_FAILURES
from kvgate.prompts import PromptError
from kvgate.routing import build_route_request
from kvgate.routing.endpoints import CONVERSATIONS, RESPONSES, engine_types_serving, serves
from kvgate.tracing import Tracing, traceparent
from kvgate.types import AdmissionKind, AdmissionRequest, AdmissionResult, RouteRequest

if TYPE_CHECKING:
    from opentelemetry.trace import Span

TENANT_HEADER = "X-KVGate-Tenant"
PRIORITY_HEADER = "X-KVGate-Priority"
CLASS_HEADER = "X-KVGate-Class"
ENDPOINT_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
# request ids: 64 random bits from a generator seeded once from the OS (uuid4 asks the
# kernel for fresh bytes on every request)
_IDS = random.Random()


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post(RESPONSES_PATH, responses)
    for surface in SURFACE_KINDS:  # embeddings, rerank, score, tokenize, detokenize
        for path in surface.paths:
            app.router.add_post(path, _surface_handler(surface.kind, path))
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model_id:.+}", get_model)
    app.router.add_get("/v1/jobs/{job_id}", get_job)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)


async def health(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    return web.json_response(
        {
            "status": "ok",
            "gateway": gateway.config.gateway_id,
            "nodes": len(gateway.specs),
            "config_version": getattr(gateway, "config_version", None),
        }
    )


async def metrics(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    for refresh in getattr(gateway, "metrics_refreshers", ()):
        await refresh()
    registry = gateway.registry
    return web.Response(
        body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )


def _model_card(model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": 0, "owned_by": "kvgate"}


async def list_models(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    identify_tenant(gateway, request)
    data = [_model_card(m) for m in gateway.models()]
    return web.json_response({"object": "list", "data": data})


async def get_model(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    identify_tenant(gateway, request)
    try:  # "default" names the one served model, as in a completion request
        model = resolve_model(request.match_info["model_id"], gateway.models())
    except UnknownModel as exc:
        raise _unknown_model(exc) from None
    return web.json_response(_model_card(model))


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await generate(request, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    return await generate(request, "completions")


async def responses(request: web.Request) -> web.StreamResponse:
    return await serve(request, RESPONSES, RESPONSES_PATH)


def _surface_handler(kind: str, path: str) -> Any:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await serve(request, kind, path)

    handler.__name__ = f"surface_{kind}"
    return handler


# -- request parsing --------------------------------------------------------------------
def _prompt_error(exc: PromptError) -> ApiError:
    text = str(exc)
    param = text.split(" ", 1)[0] if text else None
    return ApiError(400, text, param=param, code="invalid_prompt")


def engine_hasher(gateway: Gateway) -> Any:
    """The KV-event hub's prompt hasher when precise routing has a tokenizer, else None."""
    return gateway.kv_events.engine_hashes if gateway.kv_events.hashers else None


def generation_route(
    gateway: Gateway,
    body: dict[str, Any],
    endpoint: str,
    headers: Mapping[str, str],
    request_id: str,
    tenant: str,
    priority: int,
    model: str,
) -> RouteRequest:
    """A chat or completions request's route; ApiError 400 for a prompt it cannot read.
    The gateway's handler and the Endpoint Picker both build it here."""
    try:
        return build_route_request(
            body,
            endpoint=endpoint,
            headers=headers,
            request_id=request_id,
            tenant=tenant,
            priority=priority,
            config=gateway.config.routing.route_key,
            model=model,
            engine_hashes=engine_hasher(gateway),
        )
    except PromptError as exc:
        raise _prompt_error(exc) from None


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
    if not models:
        raise ApiError(503, "no node is configured", code="no_node_available")
    try:
        return resolve_model(body.get("model"), models)
    except UnknownModel as exc:
        raise _unknown_model(exc) from None


def _unknown_model(exc: UnknownModel) -> ApiError:
    return ApiError(404, f"{exc}; see /v1/models", param="model", code="model_not_found")


def _known_headers(request_id: str, flow: Flow | None) -> dict[str, str]:
    """The X-KVGate-* headers an answer can carry at the point it is given."""
    headers = {"X-Request-Id": request_id}
    if flow is None:
        return headers
    if flow.admission is not None:
        headers["X-KVGate-Admission"] = admission_header(flow.admission)
    if flow.decision is not None:
        headers["X-KVGate-Node"] = flow.decision.node_id
        headers["X-KVGate-Route-Reason"] = flow.decision.reason
    return headers


def _check_served(gateway: Gateway, kind: str, path: str, model: str) -> None:
    """404 naming the endpoint when no configured node of the model serves it."""
    for spec in gateway.specs.values():
        if spec.model in (model, "default") and serves(spec.engine_type, kind):
            return
    raise ApiError(
        404,
        f"no node serves {path} for the model {model!r} "
        f"(engine types serving it: {', '.join(engine_types_serving(kind))})",
        code="endpoint_not_served",
    )


# -- the request path -------------------------------------------------------------------
async def generate(request: web.Request, endpoint: str) -> web.StreamResponse:
    """Chat or completions (``endpoint``) through the pipeline."""
    return await serve(request, endpoint, ENDPOINT_PATHS[endpoint])


async def serve(request: web.Request, endpoint: str, path: str) -> web.StreamResponse:
    """One request of kind ``endpoint`` (chat, completions, embeddings, rerank, …)
    through the pipeline; ``path`` is where the engine is sent it."""
    gateway = request.app[GATEWAY]
    started = time.perf_counter()
    request_id = request.headers.get("X-Request-Id") or f"req-{_IDS.getrandbits(64):016x}"
    entry = request_log(request)
    entry.request_id = request_id
    flows: list[Flow] = []  # the request's flow, once it has one (for error headers)
    tracing: Tracing | None = getattr(gateway, "tracing", None)
    span = (
        tracing.request_span(f"{request.method} {request.path}", request.headers, request_id)
        if tracing is not None
        else None
    )
    status = 500
    try:
        response = await _generate(
            gateway, request, endpoint, path, request_id, started, entry, flows, span
        )
        status = response.status
        return response
    except ApiError as exc:
        status = exc.status
        exc.headers = {**_known_headers(request_id, flows[0] if flows else None), **exc.headers}
        raise
    except asyncio.CancelledError:
        status = 499  # the client left
        raise
    finally:
        if tracing is not None and span is not None:
            route = flows[0].route if flows else None
            tracing.end_request(
                span,
                status,
                route.tenant if route is not None else entry.tenant,
                route.model if route is not None else None,
            )


async def _generate(
    gateway: Gateway,
    request: web.Request,
    endpoint: str,
    path: str,
    request_id: str,
    started: float,
    entry: Any,
    flows: list[Flow],
    span: Span | None,
) -> web.StreamResponse:
    body, raw = await read_json_object(request, gateway.config.server.max_body_bytes)
    generation = endpoint in ENDPOINT_PATHS
    is_responses = endpoint == RESPONSES
    surface_tokens = 0
    if generation:
        validate_generation(body, endpoint)
    elif is_responses:
        validate_responses(body)
    else:
        surface_tokens = input_tokens(endpoint, body)
    tenant = identify_tenant(gateway, request)
    entry.tenant = tenant.name
    try:  # the key decides the class and priority range; a header only picks within it
        priority = gateway.tenants.resolve_priority(tenant, requested_priority(request, body))
        priority_class = gateway.tenants.resolve_class(tenant, request.headers.get(CLASS_HEADER))
    except NotAllowed as exc:
        raise not_allowed_error(exc) from None
    model = _model_for(gateway, body)
    if is_responses:
        _check_served(gateway, endpoint, path, model)
        route = await responses_route(
            body,
            response_map=gateway.response_map,
            nodes=gateway.nodes,
            configured=gateway.specs,
            ejected=gateway.pipeline.outlier.ejected,
            headers=request.headers,
            request_id=request_id,
            tenant=tenant.name,
            priority=priority,
            config=gateway.config.routing.route_key,
            model=model,
            engine_hashes=engine_hasher(gateway),
        )
    elif not generation:
        _check_served(gateway, endpoint, path, model)
        route = surface_route(
            endpoint,
            request_id=request_id,
            model=model,
            prompt_tokens=surface_tokens,
            tenant=tenant.name,
            priority=priority,
        )
    else:
        route = generation_route(
            gateway, body, endpoint, request.headers, request_id, tenant.name, priority, model
        )
    raw_body: bytes | None = raw
    if body.get("model") != model:  # "default" (or none) names the served model upstream
        body = {**body, "model": model}
        raw_body = None

    wants_async = "respond-async" in request.headers.get("Prefer", "").lower()
    client_bound = _client_output_bound(endpoint, body)
    flow = gateway.pipeline.start(
        route,
        AdmissionRequest(
            request_id=request_id,
            tenant=tenant.name,
            priority_class=priority_class,
            prompt_tokens=route.prompt_tokens,
            max_tokens=client_bound,
            wants_async=wants_async,
            model=model,
            stream=(generation or is_responses) and body.get("stream") is True,
        ),
        priority_min=tenant.priority_min,
        wants_async=wants_async,
        # the pipeline's stage spans hang under the request span (when it is sampled)
        traceparent=traceparent(span) if span is not None and span.is_recording() else None,
    )
    if span is not None:  # until an attempt's span replaces it (unsampled: this one)
        flow.upstream_traceparent = traceparent(span)
    elif gateway.tracing is not None:  # not traced here; the engine still gets a context
        flow.upstream_traceparent = gateway.tracing.unsampled_traceparent()
    flows.append(flow)
    result = await gateway.pipeline.admit(flow)
    entry.admission = admitted = admission_header(result)
    if result.kind is AdmissionKind.REJECT:
        raise rejection_error(result)
    raw_out = raw_body
    if client_bound is None and result.output_bound:
        # the reservation covers this many output tokens: the engine must not exceed it
        bound_field = OUTPUT_BOUND_FIELD if is_responses else "max_tokens"
        body, raw_out = {**body, bound_field: result.output_bound}, None

    call = Call(
        request_id=request_id,
        path=path,
        endpoint=endpoint,
        body=body,
        flow=flow,
        started=started,
        headers={"X-KVGate-Admission": admitted},
        raw_body=raw_out,
        usage_option=not is_responses,
    )
    if (is_responses and body.get("store") is not False) or endpoint == CONVERSATIONS:
        call.watch = ResponseWatch(gateway.response_map, flow, gateway.nodes, gateway.spawn)
    if flow.run_async:
        remote_job = getattr(gateway, "remote_job", None)  # a proxy worker: the owner runs it
        if remote_job is not None:
            return await remote_job(call)  # type: ignore[no-any-return]
        return start_async_job(gateway, call, result, tenant.name)

    try:
        assert gateway.proxy is not None
        try:
            response = await gateway.proxy.forward(call, request)
        except ApiError:
            _pinned_node_gone(gateway, flow, body)
            raise
        if call.watch is not None:
            await call.watch.finish()
    finally:
        await gateway.pipeline.release(flow)
        _log_call(entry, call)
    return response


def _client_output_bound(endpoint: str, body: dict[str, Any]) -> int | None:
    """The output bound the client set (None: admission's default applies)."""
    if endpoint in ENDPOINT_PATHS:
        return body.get("max_completion_tokens") or body.get("max_tokens")
    if endpoint == RESPONSES:
        return body.get(OUTPUT_BOUND_FIELD)
    return 0  # a non-generation request holds its input only: no decode is reserved


def _pinned_node_gone(gateway: Gateway, flow: Flow, body: dict[str, Any]) -> None:
    """A request pinned to the node holding its state, which did not answer: 404 saying
    the node is gone (no other node can continue the conversation)."""
    pin, failure = flow.route.pin, flow.last_failure
    if pin is None or failure is None or failure.kind not in NODE_GONE_FAILURES:
        return
    gateway.response_map.node_gone("unanswered", looked_up=False)
    error = node_gone_error(str(continued_id(body)), pin.node_id, failure.kind)
    error.headers = {"X-KVGate-Node": pin.node_id}
    raise error


def _log_call(entry: Any, call: Call) -> None:
    if call.decision is not None:
        entry.node = call.decision.node_id
        entry.reason = call.decision.reason
        entry.expected_cached_tokens = call.decision.expected_cached_tokens
    entry.attempts = call.attempts
    if call.usage is not None:
        entry.cached_tokens = call.usage.cached_tokens


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
            "X-KVGate-Admission": admission_header(result),
        },
    )


async def _run_job(gateway: Gateway, call: Call, result: AdmissionResult, job_id: str) -> None:
    status, body = 500, b""
    try:
        # async work waits for its turn in the admission queue, never around it
        result = await gateway.admission.until_admitted(result)
        gateway.pipeline.accept(call.flow, result)  # the final decision now holds (or not)
        if result.kind is AdmissionKind.REJECT:
            raise rejection_error(result)
        # progress goes against the reservation it now holds (the pipeline's, via accept)
        assert gateway.proxy is not None
        response = await gateway.proxy.forward(call, None)
        assert isinstance(response, web.Response)
        if call.watch is not None:
            await call.watch.finish()
        status, body = response.status, response.body  # type: ignore[assignment]
    except ApiError as exc:
        status, body = exc.status, exc.response().body  # type: ignore[assignment]
    except Exception as exc:  # the job must end with a result, never hang
        error = ApiError(500, f"job failed: {type(exc).__name__}")
        status, body = 500, error.response().body  # type: ignore[assignment]
    finally:
        await gateway.pipeline.release(call.flow)
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
