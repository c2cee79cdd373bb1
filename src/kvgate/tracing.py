"""OpenTelemetry traces: one server span per request, child spans per pipeline stage.

Off by default. On when the config file's ``tracing.enabled`` is true, or (``enabled``
unset) when the standard environment asks for OTLP: ``OTEL_TRACES_EXPORTER=otlp`` or an
``OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT``. ``OTEL_SDK_DISABLED=true`` or
``OTEL_TRACES_EXPORTER=none`` (with ``enabled`` unset) keep it off. When off nothing of
OpenTelemetry is imported and no span object is made: the gateway holds ``None`` and
every stage checks it.

On: a ``TracerProvider`` with a ``BatchSpanProcessor`` and the OTLP/HTTP exporter, a
parent-based trace-id-ratio sampler (a client's sampled ``traceparent`` is followed).
The request span (``POST /v1/chat/completions``, kind SERVER) continues the client's W3C
``traceparent``; the pipeline's ``FlowTrace`` hangs ``kvgate.admission``,
``kvgate.routing`` and one ``kvgate.attempt`` per upstream attempt under it, and each
attempt's context is sent to the engine as ``traceparent``. Parents cross processes
(``serve --workers N``: request span in the worker, stage spans in the decision owner)
as ``traceparent`` strings.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span

    from kvgate.types import AdmissionResult, RouteDecision

TRACES_PATH = "/v1/traces"
TRACEPARENT = "traceparent"
_ids = random.Random()
_SAMPLERS_WITH_RATIO = ("traceidratio", "parentbased_traceidratio")


class TracingConfig(BaseModel):
    """The YAML ``tracing:`` section; unset fields fall back to the ``OTEL_*`` variables."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool | None = None  # None: the OTEL_* environment decides (off without it)
    # OTLP/HTTP collector: a base URL (http://tempo:4318) or the full …/v1/traces URL;
    # None: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT, localhost:4318
    endpoint: str | None = None
    # fraction of new traces kept (a client's sampled traceparent is always followed);
    # None: OTEL_TRACES_SAMPLER(_ARG), else 1.0
    sampling_ratio: float | None = Field(default=None, ge=0.0, le=1.0)
    service_name: str | None = Field(default=None, min_length=1)  # None: OTEL_SERVICE_NAME

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return v


@dataclass(frozen=True, slots=True)
class TraceSettings:
    endpoint: str | None  # the full traces URL; None: the exporter reads OTEL_EXPORTER_OTLP_*
    ratio: float
    service_name: str


def settings(config: TracingConfig, env: Mapping[str, str] = os.environ) -> TraceSettings | None:
    """What tracing runs with, or None when it is off."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true" or config.enabled is False:
        return None
    if config.enabled is None:
        exporters = env.get("OTEL_TRACES_EXPORTER")
        if exporters is not None:
            on = "otlp" in [e.strip().lower() for e in exporters.split(",")]
        else:
            on = bool(
                env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
            )
        if not on:
            return None
    endpoint = config.endpoint
    if endpoint is not None and not endpoint.rstrip("/").endswith(TRACES_PATH):
        endpoint = endpoint.rstrip("/") + TRACES_PATH
    ratio = config.sampling_ratio if config.sampling_ratio is not None else _env_ratio(env)
    name = config.service_name or env.get("OTEL_SERVICE_NAME") or "kvgate"
    return TraceSettings(endpoint=endpoint, ratio=ratio, service_name=name)


def _env_ratio(env: Mapping[str, str]) -> float:
    sampler = env.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
    if sampler in ("always_off", "parentbased_always_off"):
        return 0.0
    if sampler not in _SAMPLERS_WITH_RATIO:
        return 1.0
    arg = env.get("OTEL_TRACES_SAMPLER_ARG", "1.0")
    try:
        ratio = float(arg)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"OTEL_TRACES_SAMPLER_ARG: must be a number in [0, 1], not {arg!r}")
    return ratio


def configure(config: TracingConfig, env: Mapping[str, str] = os.environ) -> Tracing | None:
    """A running ``Tracing`` (exporter thread started), or None when tracing is off."""
    chosen = settings(config, env)
    return Tracing(chosen) if chosen is not None else None


def traceparent(span: Span) -> str | None:
    """The W3C ``traceparent`` of ``span``'s context (sampled or not)."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


class Tracing:
    """One process's tracer provider, exporter and propagator."""

    def __init__(self, chosen: TraceSettings) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:  # xds-protos (the epp extra) ships an older otel proto
            raise RuntimeError(
                f"tracing: the OTLP exporter cannot load ({exc}); if xds-protos was installed "
                "after opentelemetry-proto, reinstall it: pip install --force-reinstall "
                "--no-deps opentelemetry-proto"
            ) from exc
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
        from opentelemetry.trace import SpanKind, Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.settings = chosen
        self.provider: TracerProvider = TracerProvider(
            resource=Resource.create({"service.name": chosen.service_name}),
            # the ratio is applied in request_span before the SDK is asked: an unsampled
            # root request makes no span; what reaches the SDK is recorded unless the
            # client's traceparent says unsampled
            sampler=ParentBased(ALWAYS_ON),
        )
        self.provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=chosen.endpoint))
        )
        self.tracer = self.provider.get_tracer("kvgate")
        self._propagator = TraceContextTextMapPropagator()
        self._random = _ids.random
        self._server = SpanKind.SERVER
        self._client = SpanKind.CLIENT
        self._error = Status(StatusCode.ERROR)

    def request_span(self, name: str, headers: Mapping[str, str], request_id: str) -> Span | None:
        """The server span of one request, a child of the client's ``traceparent`` if any
        (followed whether or not it is sampled); None for a request without one that the
        sampling ratio leaves out (it still sends ``unsampled_traceparent()`` on)."""
        if TRACEPARENT not in headers and self._random() >= self.settings.ratio:
            return None
        return self.tracer.start_span(
            name,
            context=self._propagator.extract(headers),
            kind=self._server,
            attributes={"kvgate.request_id": request_id},
        )

    @staticmethod
    def unsampled_traceparent() -> str:
        """A new trace's ``traceparent`` with the sampled flag off (what an engine is sent
        for a request that is not traced here)."""
        return f"00-{_ids.getrandbits(128) or 1:032x}-{_ids.getrandbits(64) or 1:016x}-00"

    def end_request(self, span: Span, status: int, tenant: str | None, model: str | None) -> None:
        span.set_attribute("http.response.status_code", status)
        if tenant is not None:
            span.set_attribute("kvgate.tenant", tenant)
        if model is not None:
            span.set_attribute("kvgate.model", model)
        if status >= 500:
            span.set_status(self._error)
        span.end()

    def flow_trace(self, parent: str) -> FlowTrace:
        return FlowTrace(self, self._propagator.extract({"traceparent": parent}))

    def shutdown(self) -> None:
        """Export what is buffered and stop the exporter thread."""
        self.provider.shutdown()


class FlowTrace:
    """The stage spans of one request in the pipeline: admission, routing, attempts."""

    __slots__ = ("_attempt", "_parent", "_tracing")

    def __init__(self, tracing: Tracing, parent: Context) -> None:
        self._tracing = tracing
        self._parent = parent
        self._attempt: Span | None = None

    def start(self, name: str, **attributes: Any) -> Span:
        return self._tracing.tracer.start_span(name, context=self._parent, attributes=attributes)

    def admitted(self, span: Span, result: AdmissionResult | None) -> None:
        if result is None:  # the client left while queued
            span.set_attribute("kvgate.admission.decision", "cancelled")
        else:
            span.set_attributes(
                {
                    "kvgate.admission.decision": result.kind.value,
                    "kvgate.admission.reason": result.reason,
                    "kvgate.admission.queue_wait_s": result.queued_seconds,
                    "kvgate.admission.reserved_tokens": result.reserved_tokens,
                }
            )
            if result.degrade_to is not None:
                span.set_attribute("kvgate.admission.degrade_to", result.degrade_to)
        span.end()

    def routed(self, span: Span, decision: RouteDecision | None, error: str | None) -> None:
        if decision is not None:
            span.set_attributes(
                {
                    "kvgate.route.policy": decision.policy,
                    "kvgate.route.node": decision.node_id,
                    "kvgate.route.reason": decision.reason,
                    "kvgate.route.expected_cached_tokens": decision.expected_cached_tokens,
                }
            )
        else:
            span.set_attribute("kvgate.route.error", error or "no node")
            span.set_status(self._tracing._error)
        span.end()

    def attempt_started(self, decision: RouteDecision, number: int, url: str | None) -> str | None:
        """Open the attempt's span; its ``traceparent`` (what the engine is sent)."""
        self.attempt_ended()  # a previous attempt left open (never expected)
        attributes: dict[str, Any] = {"kvgate.node": decision.node_id, "kvgate.attempt": number}
        if url is not None:
            attributes["server.url"] = url
        span = self._tracing.tracer.start_span(
            "kvgate.attempt",
            context=self._parent,
            kind=self._tracing._client,
            attributes=attributes,
        )
        self._attempt = span
        return traceparent(span)

    def attempt_ended(
        self,
        *,
        status: int | None = None,
        failure: str | None = None,
        ok: bool | None = None,
    ) -> None:
        span, self._attempt = self._attempt, None
        if span is None:
            return
        if status is not None:
            span.set_attribute("http.response.status_code", status)
        if ok is not None:
            span.set_attribute("kvgate.attempt.ok", ok)
        if failure is not None:
            span.set_attribute("kvgate.failure_kind", failure)
            span.set_status(self._tracing._error)
        span.end()


__all__ = ["FlowTrace", "TraceSettings", "Tracing", "TracingConfig", "configure", "settings"]
