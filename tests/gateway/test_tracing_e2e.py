"""OpenTelemetry traces through real processes: a ``kvgate serve`` process (1 and 2 proxy
workers) in front of a real ``kvgate engine-sim`` process, exporting OTLP/HTTP to a real
receiver in this test (an aiohttp server decoding the protobuf payloads with
``opentelemetry-proto``).

A chat completion sent with a client ``traceparent`` yields the span tree
request (SERVER, child of the client's span) → ``kvgate.admission``, ``kvgate.routing``,
``kvgate.attempt`` with their attributes, all in the client's trace; the engine is sent a
``traceparent`` naming the attempt's span (engine-sim echoes it as
``X-Engine-Traceparent``). Tracing off (the default): no spans, no ``traceparent`` sent to
the engine (kvgate does not pass a client's through either), no exporter thread.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from kvgate.tracing import TracingConfig, configure, settings
from tests.fixtures.gateway import running_gateway, start_gateway_process
from tests.gateway._engines import MODEL, engines

KEY = "k-acme"
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
CLIENT_TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
ADMISSION = {"total_quota": 20000, "tenants": [{"name": "acme", "api_keys": [KEY]}]}
# export at once rather than every 5 s (the SDK's batch processor reads this)
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100"}


class Receiver:
    """An OTLP/HTTP trace receiver (POST /v1/traces) on a loopback port, in a thread."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.posts = 0
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.port = 0

    def __enter__(self) -> Receiver:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *_: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    async def _traces(self, request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf"
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        spans = []
        for resource_spans in message.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(
                        {
                            "name": span.name,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_span_id": span.parent_span_id.hex(),
                            "kind": span.kind,
                            "duration_ms": (span.end_time_unix_nano - span.start_time_unix_nano)
                            / 1e6,
                            "attributes": _attributes(span.attributes),
                            "service": resource.get("service.name"),
                        }
                    )
        with self._lock:
            self.posts += 1
            self.spans.extend(spans)
        return web.Response(body=b"", content_type="application/x-protobuf")

    def wait_for(self, names: set[str], timeout: float = 20.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                spans = list(self.spans)
            if names <= {s["name"] for s in spans}:
                return spans
            time.sleep(0.05)
        raise AssertionError(f"spans {names} did not all arrive; got {spans}")


def _attributes(kvs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in kvs:
        value = kv.value
        field = value.WhichOneof("value")
        out[kv.key] = getattr(value, field) if field is not None else None
    return out


def _chat(url: str, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={
            "Authorization": f"Bearer {KEY}",
            "Content-Type": "application/json",
            "X-Request-Id": "req-trace-1",
            **headers,
        },
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()
        return response.status, dict(response.headers)


@pytest.fixture
def no_otel_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The gateway processes inherit this process's environment: no OTEL_* from outside."""
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    yield


@pytest.mark.parametrize("workers", [1, 2], ids=["w1", "w2"])
def test_spans_continue_the_client_trace_and_reach_the_engine(
    workers: int, no_otel_env: None
) -> None:
    with Receiver() as receiver, engines(1) as (engine,):
        config = {
            "nodes": [{"id": "e0", "url": engine.url}],
            "admission": ADMISSION,
            "tracing": {"enabled": True, "endpoint": receiver.url, "service_name": "kvgate-test"},
        }
        gw = start_gateway_process(
            config=config, extra_args=["--workers", str(workers)], env=FAST_EXPORT
        )
        try:
            status, headers = _chat(gw.url, {"traceparent": CLIENT_TRACEPARENT})
            spans = receiver.wait_for(
                {
                    "POST /v1/chat/completions",
                    "kvgate.admission",
                    "kvgate.routing",
                    "kvgate.attempt",
                }
            )
        finally:
            gw.stop()
    assert status == 200
    by_name = {s["name"]: s for s in spans}
    request = by_name["POST /v1/chat/completions"]
    admission = by_name["kvgate.admission"]
    routing = by_name["kvgate.routing"]
    attempt = by_name["kvgate.attempt"]
    # one trace, the client's; the request span is the client span's child, the rest its
    assert {s["trace_id"] for s in spans} == {CLIENT_TRACE}
    assert request["parent_span_id"] == CLIENT_SPAN
    for child in (admission, routing, attempt):
        assert child["parent_span_id"] == request["span_id"], child
    assert request["kind"] == 2 and attempt["kind"] == 3  # SERVER, CLIENT
    assert {s["service"] for s in spans} == {"kvgate-test"}
    assert request["attributes"] == {
        "kvgate.request_id": "req-trace-1",
        "kvgate.tenant": "acme",
        "kvgate.model": MODEL,
        "http.response.status_code": 200,
    }
    assert admission["attributes"]["kvgate.admission.decision"] == "admit"
    assert admission["attributes"]["kvgate.admission.reason"]
    assert admission["attributes"]["kvgate.admission.queue_wait_s"] == 0.0
    assert routing["attributes"]["kvgate.route.node"] == "e0"
    assert routing["attributes"]["kvgate.route.policy"]
    assert routing["attributes"]["kvgate.route.reason"] == headers["X-KVGate-Route-Reason"]
    assert routing["attributes"]["kvgate.route.expected_cached_tokens"] == 0
    assert attempt["attributes"] == {
        "kvgate.node": "e0",
        "kvgate.attempt": 1,
        "server.url": engine.url,
        "http.response.status_code": 200,
        "kvgate.attempt.ok": True,
    }
    # the engine was sent the attempt's context: same trace, the attempt span as parent
    assert headers["X-Engine-Traceparent"] == f"00-{CLIENT_TRACE}-{attempt['span_id']}-01"
    print(json.dumps(spans, indent=1))  # the span dump in docs/operations.md


def test_tracing_off_sends_no_traceparent_and_exports_nothing(no_otel_env: None) -> None:
    with Receiver() as receiver, engines(1) as (engine,):
        config = {"nodes": [{"id": "e0", "url": engine.url}], "admission": ADMISSION}
        gw = start_gateway_process(
            config=config,
            extra_args=["--workers", "1"],
            env={**FAST_EXPORT, "OTEL_EXPORTER_OTLP_ENDPOINT": ""},
        )
        try:
            plain = _chat(gw.url, {})
            client = _chat(gw.url, {"traceparent": CLIENT_TRACEPARENT})
            time.sleep(0.5)  # several export periods
        finally:
            gw.stop()
    for status, headers in (plain, client):
        assert status == 200
        assert "X-Engine-Traceparent" not in headers  # nothing injected, nothing passed on
    assert receiver.posts == 0


async def test_tracing_off_starts_no_exporter(no_otel_env: None) -> None:
    with engines(1) as (engine,):
        async with running_gateway({"nodes": [{"id": "e0", "url": engine.url}]}) as gw:
            assert gw.gateway.tracing is None and gw.gateway.pipeline.tracing is None
            names = [t.name for t in threading.enumerate()]
            assert not [n for n in names if n.startswith("OtelBatch")], names


def test_settings_from_config_and_environment() -> None:
    off = TracingConfig()
    assert settings(off, {}) is None
    assert configure(off, {}) is None
    assert settings(TracingConfig(enabled=False), {"OTEL_TRACES_EXPORTER": "otlp"}) is None
    assert settings(off, {"OTEL_TRACES_EXPORTER": "none"}) is None
    assert (
        settings(off, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"})
        is None
    )
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.1",
        "OTEL_SERVICE_NAME": "gw-a",
    }
    chosen = settings(off, env)
    assert chosen is not None
    assert (chosen.endpoint, chosen.ratio, chosen.service_name) == (None, 0.1, "gw-a")
    file = TracingConfig(enabled=True, endpoint="http://t:4318/", sampling_ratio=0.5)
    chosen = settings(file, env)
    assert chosen is not None
    assert (chosen.endpoint, chosen.ratio) == ("http://t:4318/v1/traces", 0.5)
    with pytest.raises(ValueError, match="OTEL_TRACES_SAMPLER_ARG"):
        settings(off, {**env, "OTEL_TRACES_SAMPLER_ARG": "lots"})


def test_config_errors_name_the_field() -> None:
    from kvgate.gateway.config import ConfigError, parse_config

    with pytest.raises(ConfigError, match=r"tracing\.sampling_ratio"):
        parse_config({"tracing": {"sampling_ratio": 2}})
    with pytest.raises(ConfigError, match=r"tracing\.endpoint: must start with http"):
        parse_config({"tracing": {"endpoint": "tempo:4318"}})
    with pytest.raises(ConfigError, match=r"tracing\.sample"):
        parse_config({"tracing": {"sample": 0.1}})
