"""One ext_proc stream (one HTTP request through Envoy) driving the request pipeline.

Request headers: the tenant from the API key (401/403 at once), the processing modes
Envoy announced. Request body (chunks until ``end_of_stream``, or one buffered message):
parse, admit (the request may wait in the admission queue), route, and only then answer:
the destination endpoint as the ``x-gateway-destination-endpoint`` header and
``envoy.lb`` metadata, the body Envoy sends on (changed only where serve changes it).
In full duplex mode the header answer waits for the decision and the body goes back
as a streamed chunk; in buffered mode both go back in the body answer. A refusal is an
ImmediateResponse with the OpenAI-style body serve gives.

Response headers: a 5xx/429 Envoy relays (or makes itself when the engine cannot be
reached) is the attempt's failure (the outlier detector ejects on it); otherwise the
X-KVGate-* headers are added. Response body chunks pass on as they come, read for the
first token, progress and usage. The reservation is released when the answer ends,
and in ``close`` whatever happened (a client reset, Envoy closing the stream, the gRPC
stream breaking).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from typing import Literal

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from kvgate.admission.config import TenantConfig
from kvgate.epp import messages as msg
from kvgate.epp.admit import (
    ENDPOINTS,
    Admitted,
    admission_headers,
    admit,
    authenticate,
    decode_body,
    request_id,
    start_flow,
)
from kvgate.epp.endpoints import node_address, outside
from kvgate.epp.metrics import EppMetrics
from kvgate.epp.observe import StreamObserver, UnaryObserver
from kvgate.gateway.errors import ApiError, classify_exception
from kvgate.gateway.gateway import Gateway
from kvgate.gateway.handlers import _model_card
from kvgate.gateway.logs import RequestLog, access_log
from kvgate.pipeline import AttemptOutcome, Failure, Flow, GiveUp
from kvgate.types import RouteDecision

log = logging.getLogger("kvgate.epp")

Responses = list[pb.ProcessingResponse]
End = Literal["completed", "answered", "ended_early", "cancelled"]
# set by Envoy's router on an answer that came from the engine; absent on its own replies
_UPSTREAM_TIME = "x-envoy-upstream-service-time"


def _failure_kind(status: int, headers: dict[str, str]) -> str | None:
    """The failure an answer stands for (None: an answer to relay as it is)."""
    if status == 429:
        return "overloaded"
    if status in (502, 503, 504):
        return "http_5xx" if _UPSTREAM_TIME in headers else "connect"
    return None


class EppStream:
    def __init__(self, gateway: Gateway, metrics: EppMetrics) -> None:
        self.gateway = gateway
        self.metrics = metrics
        self.started = time.perf_counter()
        self.request_mode = msg.FULL_DUPLEX
        self.response_mode = msg.FULL_DUPLEX
        self.headers: dict[str, str] = {}
        self.subset: frozenset[str] | None = None
        self.rid = ""
        self.path = ""
        self.endpoint: str | None = None  # the request kind: chat, completions, embeddings, …
        self.tenant: TenantConfig | None = None
        self._chunks: list[bytes] = []
        self._size = 0
        self.flow: Flow | None = None
        self.admitted: Admitted | None = None
        self.decided = False
        self.settled = False  # the attempt's outcome went to the pipeline
        self.status: int | None = None  # what the client got
        self.end: End | None = None
        self._stream_obs: StreamObserver | None = None
        self._unary_obs: UnaryObserver | None = None
        self._reported = 0
        self._first_token = False
        self._replacement: bytes | None = None  # an OpenAI body in place of Envoy's own
        metrics.active.inc()
        gateway.metrics.inflight.inc()  # as serve counts a request inside the gateway

    # -- dispatch ------------------------------------------------------------------------
    async def handle(self, request: pb.ProcessingRequest) -> Responses:
        """The answers to one message from Envoy (none while the picker waits for more)."""
        kind = request.WhichOneof("request")
        try:
            if kind == "request_headers":
                return self._request_headers(request)
            if kind == "request_body":
                return await self._request_body(request.request_body)
            if kind == "request_trailers":
                return await self._request_trailers()
            if kind == "response_headers":
                return self._response_headers(request.response_headers)
            if kind == "response_body":
                return await self._response_body(request.response_body)
            if kind == "response_trailers":
                await self._complete()
                return [msg.trailers_response(request=False)]
        except ApiError as exc:
            return [self._refuse(exc)]
        except GiveUp as stop:
            return [self._refuse(_give_up_error(stop))]
        except Exception as exc:  # every request ends in an answer, a bug's too
            if self.decided:  # the request is on its way: nothing can be answered now
                raise
            return [self._refuse(_unexpected(exc))]
        return []

    def _refuse(self, error: ApiError) -> pb.ProcessingResponse:
        headers = {"x-request-id": self.rid} if self.rid else {}
        if self.flow is not None:
            headers.update(admission_headers(self.flow))
        self.status = error.status
        self.end = "answered"
        return msg.error_response(error, headers)

    # -- request -------------------------------------------------------------------------
    def _request_headers(self, request: pb.ProcessingRequest) -> Responses:
        if request.HasField("protocol_config"):
            self.request_mode = request.protocol_config.request_body_mode
            self.response_mode = request.protocol_config.response_body_mode
        self.headers = headers = msg.header_map(request.request_headers)
        self.subset = msg.subset_hint(request)
        self.rid = request_id(headers)
        self.path = path = headers.get(":path", "/").split("?", 1)[0]
        method = headers.get(":method", "GET")
        if path == "/v1/models" and method == "GET":
            authenticate(self.gateway, headers)
            data = [_model_card(m) for m in self.gateway.models()]
            self.status, self.end = 200, "answered"
            return [msg.json_response({"object": "list", "data": data}, {"x-request-id": self.rid})]
        self.endpoint = ENDPOINTS.get(path)
        if self.endpoint is None:
            raise ApiError(404, f"no route for {method} {path}", code="not_found")
        if method != "POST":
            raise ApiError(
                405, "Method Not Allowed", code="method_not_allowed", headers={"Allow": "POST"}
            )
        self.tenant = authenticate(self.gateway, headers)
        if request.request_headers.end_of_stream:
            raise ApiError(400, "request body is empty; send a JSON object", code="invalid_json")
        if self.request_mode == msg.FULL_DUPLEX:
            return []  # the header answer carries the decision: it waits for the body
        if self.request_mode in (msg.STREAMED, msg.BUFFERED_PARTIAL):
            # the decision needs the whole body before the headers go on: have it buffered
            self.request_mode = msg.BUFFERED
            return [msg.request_headers_response(buffer_body=True)]
        return [msg.request_headers_response()]

    async def _request_body(self, body: pb.HttpBody) -> Responses:
        if self.decided:  # a chunk after the decision (trailers came first): pass it on
            return [self._request_chunk(body.body, body.end_of_stream)]
        self._size += len(body.body)
        limit = self.gateway.config.server.max_body_bytes
        if self._size > limit:
            raise ApiError(
                413, f"request body too large (limit {limit} bytes)", code="body_too_large"
            )
        self._chunks.append(body.body)
        if not body.end_of_stream:
            if self.request_mode != msg.FULL_DUPLEX:  # each chunk would want an answer
                raise ApiError(
                    500,
                    "the picker needs request_body_mode FULL_DUPLEX_STREAMED or BUFFERED "
                    "(or allow_mode_override)",
                    code="picker_misconfigured",
                )
            return []
        return await self._decide(end_of_stream=True)

    async def _request_trailers(self) -> Responses:
        out = [] if self.decided else await self._decide(end_of_stream=False)
        if self.end == "answered":
            return out
        return [*out, msg.trailers_response(request=True)]

    def _request_chunk(self, data: bytes, end_of_stream: bool) -> pb.ProcessingResponse:
        return msg.body_response(
            data,
            request=True,
            full_duplex=self.request_mode == msg.FULL_DUPLEX,
            end_of_stream=end_of_stream,
        )

    async def _decide(self, *, end_of_stream: bool) -> Responses:
        """Admit and route the whole request; the answers that send it on its way."""
        assert self.endpoint is not None and self.tenant is not None
        gateway = self.gateway
        raw, encoded = decode_body(
            b"".join(self._chunks), self.headers, gateway.config.server.max_body_bytes
        )
        self._chunks = []
        waited = time.perf_counter()
        flow, body, changed = start_flow(
            gateway, self.tenant, self.headers, self.endpoint, self.path, raw, self.rid
        )
        self.flow = flow
        if self.subset is not None:
            flow.ineligible, eligible = outside(gateway, self.subset)
            if not eligible:
                raise ApiError(
                    503,
                    "no node of the subset Envoy allows is known to the picker",
                    code="no_eligible_endpoint",
                    headers={"Retry-After": "1"},
                )
        self.admitted = admitted = await admit(gateway, flow, body, raw, changed)
        decision = gateway.pipeline.next_attempt(flow)
        endpoint = node_address(gateway, decision.node_id)
        if endpoint is None:  # removed between routing and now
            gateway.pipeline.attempt_failed(
                flow, decision, Failure("node_removed", f"node {decision.node_id} was removed")
            )
            self.settled = True
            raise ApiError(503, "the chosen node was removed", code="no_node_available")
        self.decided = True
        self.metrics.decision_seconds.observe(time.perf_counter() - waited)
        mutation = msg.header_mutation(
            {msg.DESTINATION_HEADER: endpoint, "content-length": str(len(admitted.body))},
            # the engine gets the decoded body, as from serve
            remove=["content-encoding"] if encoded else (),
        )
        metadata = msg.destination_metadata(endpoint)
        if self.request_mode == msg.FULL_DUPLEX:
            return [
                msg.request_headers_response(mutation, metadata),
                self._request_chunk(admitted.body, end_of_stream),
            ]
        return [
            msg.body_response(
                admitted.body,
                request=True,
                full_duplex=False,
                end_of_stream=end_of_stream,
                mutation=mutation,
                metadata=metadata,
            )
        ]

    # -- response ------------------------------------------------------------------------
    def _response_headers(self, response: pb.HttpHeaders) -> Responses:
        headers = msg.header_map(response)
        try:
            self.status = int(headers.get(":status", "0"))
        except ValueError:
            self.status = 0
        flow, admitted = self.flow, self.admitted
        if flow is None or admitted is None or flow.decision is None:
            return [msg.response_headers_response(None)]
        decision = flow.decision
        extra = {"x-request-id": self.rid, **admission_headers(flow)}
        remove: list[str] = []
        kind = _failure_kind(self.status, headers)
        if kind is not None:
            self._fail(flow, decision, kind)
            if kind == "connect" and not response.end_of_stream:
                error = ApiError(
                    self.status,
                    f"engine {decision.node_id} could not be reached",
                    code="upstream_connect",
                )
                self._replacement = json.dumps(error.body()).encode()
                extra["content-type"] = "application/json"
                remove.append("content-length")
        elif admitted.stream and self.status < 400:
            self._stream_obs = StreamObserver(
                strip_usage=admitted.strip_usage,
                progress_batch=self.gateway.config.server.progress_batch_tokens,
            )
            if admitted.strip_usage:
                remove.append("content-length")
        else:
            self._unary_obs = UnaryObserver()
        out = [msg.response_headers_response(msg.header_mutation(extra, remove))]
        if response.end_of_stream or self.response_mode == msg.NO_BODY:
            self._settle_done()  # no body will come: the attempt ended with its headers
        return out

    def _fail(self, flow: Flow, decision: RouteDecision, kind: str) -> None:
        assert self.status is not None
        self.metrics.upstream_failures.labels(kind).inc()
        failure = Failure(kind, f"engine answered {self.status}", status=self.status)
        self.gateway.pipeline.attempt_failed(flow, decision, failure)
        self.settled = True
        log.warning(
            "upstream failure request_id=%s node=%s kind=%s status=%s",
            self.rid,
            decision.node_id,
            kind,
            self.status,
        )

    async def _response_body(self, body: pb.HttpBody) -> Responses:
        data, eos = body.body, body.end_of_stream
        out = data
        if self._replacement is not None:
            out = self._replacement if eos else b""
        elif self._stream_obs is not None:
            out, count = self._stream_obs.feed(data)
            if eos:
                out += self._stream_obs.finish()
            if count is not None:
                await self._progress(count)
        elif self._unary_obs is not None:
            self._unary_obs.feed(data)
        if eos:
            await self._complete()
        full_duplex = self.response_mode == msg.FULL_DUPLEX
        if full_duplex and not out and not eos:
            return []
        return [
            msg.body_response(
                out if full_duplex or out != data else None,
                request=False,
                full_duplex=full_duplex,
                end_of_stream=eos,
            )
        ]

    async def _progress(self, generated: int) -> None:
        assert self.flow is not None
        if not self._first_token:
            self._first_token = True
            self._observe_ttft()
        self._reported = generated
        await self.gateway.pipeline.progress(self.flow, generated)

    def _observe_ttft(self) -> None:
        metrics = self.gateway.metrics
        metrics.child(metrics.ttft, self.path).observe(time.perf_counter() - self.started)

    async def _complete(self) -> None:
        """The answer ended: the attempt's outcome, then the reservation goes back."""
        if self.flow is None:
            return
        if not self.settled and self.flow.decision is not None:
            if self._unary_obs is not None:
                self._unary_obs.finish()
                if self.status is not None and self.status < 400:
                    self._observe_ttft()
            outcome = self._outcome(ok=self.status is not None and self.status < 400)
            if outcome.ok and outcome.output_tokens and outcome.output_tokens != self._reported:
                await self.gateway.pipeline.progress(self.flow, outcome.output_tokens)
            self.gateway.pipeline.attempt_done(self.flow, self.flow.decision, outcome)
            self.settled = True
        self.end = self.end or "completed"
        await self.gateway.pipeline.release(self.flow)

    def _settle_done(self) -> None:
        """An answer without a body (headers with end_of_stream)."""
        if self.flow is not None and self.flow.decision is not None and not self.settled:
            ok = self.status is not None and self.status < 400
            self.gateway.pipeline.attempt_done(self.flow, self.flow.decision, self._outcome(ok=ok))
            self.settled = True
            self.end = "completed"

    def _outcome(self, *, ok: bool) -> AttemptOutcome:
        usage = None
        generated = 0
        if self._stream_obs is not None:
            usage, generated = self._stream_obs.usage, self._stream_obs.generated
        elif self._unary_obs is not None:
            usage = self._unary_obs.usage
        outcome = AttemptOutcome(ok=ok, output_tokens=generated, status=self.status)
        if usage is not None:
            outcome.cached_tokens = usage.cached_tokens
            if usage.completion_tokens is not None:
                outcome.output_tokens = usage.completion_tokens
            if self.flow is not None and self.flow.decision is not None:
                metrics, node = self.gateway.metrics, self.flow.decision.node_id
                if usage.prompt_tokens is not None:
                    metrics.child(metrics.prompt_tokens, node).inc(usage.prompt_tokens)
                if usage.completion_tokens is not None:
                    metrics.child(metrics.completion_tokens, node).inc(usage.completion_tokens)
        return outcome

    # -- end -----------------------------------------------------------------------------
    async def close(self, *, cancelled: bool) -> None:
        """The stream is over (``cancelled``: it broke): settle and release, once."""
        flow = self.flow
        if flow is not None and flow.decision is not None and not self.settled:
            # Envoy went away before the answer ended: a client reset or a broken stream
            self.gateway.metrics.client_disconnects.inc()
            self.gateway.pipeline.cancelled("upstream")
            self.gateway.pipeline.attempt_done(flow, flow.decision, self._outcome(ok=False))
            self.settled = True
            self.status = 499
        if self.end is None:
            self.end = "cancelled" if cancelled else "ended_early"
        if flow is not None:
            await self.gateway.pipeline.release(flow)
        self.metrics.active.dec()
        self.metrics.streams.labels(self.end).inc()
        metrics = self.gateway.metrics
        metrics.inflight.dec()
        if self.endpoint is not None or self.end == "answered":
            label = self.path or "unmatched"
            elapsed = time.perf_counter() - self.started
            metrics.child(metrics.requests, label, str(self.status or 499)).inc()
            metrics.child(metrics.request_duration, label).observe(elapsed)
            if access_log.isEnabledFor(logging.INFO):
                access_log.info(json.dumps(self._log_fields(label, elapsed), separators=(",", ":")))

    def _log_fields(self, path: str, elapsed: float) -> dict[str, object]:
        """The access-log line serve writes (``kvgate.gateway.logs``): no prompt text."""
        entry = RequestLog(request_id=self.rid, tenant=self.tenant.name if self.tenant else None)
        flow = self.flow
        if flow is not None:
            if flow.admission is not None:
                entry.admission = admission_headers(flow).get("X-KVGate-Admission")
            if flow.decision is not None:
                entry.node, entry.reason = flow.decision.node_id, flow.decision.reason
                entry.expected_cached_tokens = flow.decision.expected_cached_tokens
            entry.attempts = flow.attempts
        usage = self._stream_obs.usage if self._stream_obs else None
        usage = usage or (self._unary_obs.usage if self._unary_obs else None)
        if usage is not None:
            entry.cached_tokens = usage.cached_tokens
        fields: dict[str, object] = {
            "method": self.headers.get(":method", ""),
            "path": path,
            "status": self.status or 499,
            "latency_ms": round(elapsed * 1000, 2),
            "epp_end": self.end,
        }
        fields.update({k: v for k, v in asdict(entry).items() if v not in (None, "", 0)})
        return fields


def _give_up_error(stop: GiveUp) -> ApiError:
    headers = {}
    if stop.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, round(stop.retry_after_s)))
    return ApiError(stop.status, str(stop), code=stop.code, headers=headers)


def _unexpected(exc: Exception) -> ApiError:
    _kind, status = classify_exception(exc)
    if status == 400:
        return ApiError(400, "the request could not be processed as sent", code="bad_request")
    if status == 503:
        return ApiError(
            503,
            "state store unavailable; retry later",
            code="store_unavailable",
            headers={"Retry-After": "1"},
        )
    log.error("unhandled error in the picker", exc_info=exc)
    return ApiError(500, "internal gateway error", type_="server_error", code="internal_error")
