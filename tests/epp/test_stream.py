"""The picker's per-stream state machine fed real ext_proc protobuf messages, against
an in-process gateway (the objects ``kvgate serve`` builds) and a real engine-sim."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from kvgate.epp import messages as msg
from kvgate.epp.endpoints import address
from kvgate.epp.metrics import EppMetrics
from kvgate.epp.stream import EppStream
from kvgate.gateway.config import parse_config
from kvgate.gateway.gateway import Gateway
from kvgate.procs import EngineProcess, start_engine_process
from tests.epp import frames

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def engine() -> Iterator[EngineProcess]:
    proc = start_engine_process(count=1)
    yield proc
    proc.stop()


def _config(engine: EngineProcess, **admission: Any) -> dict[str, Any]:
    return {
        "nodes": [{"id": "n0", "url": engine.url, "model": "sim"}],
        "admission": {
            "tenants": [{"name": "acme", "api_keys": ["k-acme"]}],
            **admission,
        },
    }


@pytest.fixture
async def gateway(engine: EngineProcess) -> AsyncIterator[Gateway]:
    gw = Gateway(parse_config(_config(engine)), registry=CollectorRegistry())
    await gw.start()
    yield gw
    await gw.stop()


def _stream(gateway: Gateway) -> EppStream:
    return EppStream(gateway, EppMetrics(CollectorRegistry()))


def _chat(stream: bool = False, **extra: Any) -> bytes:
    body = {
        "model": "sim",
        "messages": [{"role": "user", "content": "tell me about caches " * 8}],
        "max_tokens": 4,
        "stream": stream,
        **extra,
    }
    return json.dumps(body).encode()


def _error(response: Any) -> tuple[int, dict[str, Any]]:
    assert response.WhichOneof("response") == "immediate_response"
    answer = response.immediate_response
    return answer.status.code, json.loads(answer.body)


async def test_full_duplex_answers_headers_only_once_decided(gateway: Gateway) -> None:
    s = _stream(gateway)
    assert await s.handle(frames.post(CHAT, "k-acme")) == []
    raw = _chat()
    assert await s.handle(frames.body(raw[:10], end_of_stream=False)) == []
    out = await s.handle(frames.body(raw[10:], end_of_stream=True))
    assert [o.WhichOneof("response") for o in out] == ["request_headers", "request_body"]
    endpoint = address(gateway.specs["n0"].url)
    set_headers = frames.set_headers(out[0].request_headers.response.header_mutation)
    assert set_headers[msg.DESTINATION_HEADER] == endpoint
    lb = out[0].dynamic_metadata.fields[msg.LB_NAMESPACE].struct_value
    assert lb.fields[msg.DESTINATION_HEADER].string_value == endpoint
    streamed = out[1].request_body.response.body_mutation.streamed_response
    assert streamed.end_of_stream
    assert json.loads(streamed.body) == json.loads(raw)  # nothing needed changing
    assert int(set_headers["content-length"]) == len(streamed.body)
    assert s.flow is not None and s.flow.holds_reservation
    await s.close(cancelled=False)  # Envoy closed before any answer: the client left
    assert not s.flow.holds_reservation
    assert s.end == "ended_early"
    assert gateway.metrics.client_disconnects._value.get() == 1


async def test_buffered_body_carries_the_decision(gateway: Gateway) -> None:
    s = _stream(gateway)
    out = await s.handle(frames.post(CHAT, "k-acme", mode=msg.BUFFERED))
    assert [o.WhichOneof("response") for o in out] == ["request_headers"]
    out = await s.handle(frames.body(_chat(), end_of_stream=True))
    assert [o.WhichOneof("response") for o in out] == ["request_body"]
    common = out[0].request_body.response
    assert frames.set_headers(common.header_mutation)[msg.DESTINATION_HEADER] == address(
        gateway.specs["n0"].url
    )
    assert json.loads(common.body_mutation.body)["max_tokens"] == 4
    assert out[0].dynamic_metadata.fields[msg.LB_NAMESPACE].struct_value.fields
    await s.close(cancelled=True)
    assert s.end == "cancelled"


async def test_streamed_answer_passes_through_and_releases_at_its_end(gateway: Gateway) -> None:
    s = _stream(gateway)
    await s.handle(frames.post(CHAT, "k-acme"))
    out = await s.handle(frames.body(_chat(stream=True), end_of_stream=True))
    sent = json.loads(out[1].request_body.response.body_mutation.streamed_response.body)
    assert sent["stream_options"] == {"include_usage": True}  # for kvgate's accounting
    out = await s.handle(frames.response_headers(200, {"content-type": "text/event-stream"}))
    added = frames.set_headers(out[0].response_headers.response.header_mutation)
    assert added["x-kvgate-node"] == "n0"
    assert added["x-kvgate-admission"].startswith("admit")
    chunk = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}],"usage":null}\n\n'
    usage = (
        b'data: {"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":1,'
        b'"prompt_tokens_details":{"cached_tokens":32}}}\n\n'
    )
    out = await s.handle(frames.response_body(chunk + b'data: {"cho', end_of_stream=False))
    passed = out[0].response_body.response.body_mutation.streamed_response
    assert passed.body == b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    assert s._reported == 1  # the first token reached the pipeline at once
    rest = b'ices":[{"index":0,"delta":{"content":"!"}}],"usage":null}\n\n'
    out = await s.handle(
        frames.response_body(rest + usage + b"data: [DONE]\n\n", end_of_stream=True)
    )
    passed = out[0].response_body.response.body_mutation.streamed_response
    assert passed.end_of_stream
    assert b'"usage"' not in passed.body  # the client did not ask for usage
    assert passed.body.endswith(b"data: [DONE]\n\n")
    assert s.flow is not None and not s.flow.holds_reservation  # released at the end
    assert s.end == "completed"
    await s.close(cancelled=False)
    assert s.end == "completed"


async def test_non_json_body_is_a_400_with_an_openai_body(gateway: Gateway) -> None:
    s = _stream(gateway)
    await s.handle(frames.post(CHAT, "k-acme"))
    out = await s.handle(frames.body(b"not json", end_of_stream=True))
    status, body = _error(out[0])
    assert status == 400
    assert body["error"]["code"] == "invalid_json"
    assert body["error"]["type"] == "invalid_request_error"
    assert s.end == "answered"


async def test_unknown_key_is_401_before_any_body(gateway: Gateway) -> None:
    s = _stream(gateway)
    out = await s.handle(frames.post(CHAT, "wrong"))
    status, body = _error(out[0])
    assert (status, body["error"]["code"]) == (401, "invalid_api_key")


async def test_subset_hint_limits_the_nodes(gateway: Gateway) -> None:
    s = _stream(gateway)
    await s.handle(frames.post(CHAT, "k-acme", subset=["10.9.9.9:80"]))
    out = await s.handle(frames.body(_chat(), end_of_stream=True))
    status, body = _error(out[0])
    assert (status, body["error"]["code"]) == (503, "no_eligible_endpoint")
    s = _stream(gateway)
    await s.handle(frames.post(CHAT, "k-acme", subset=[address(gateway.specs["n0"].url)]))
    out = await s.handle(frames.body(_chat(), end_of_stream=True))
    assert out[0].WhichOneof("response") == "request_headers"
    await s.close(cancelled=False)


async def test_envoys_own_503_fails_the_attempt_and_gets_an_openai_body(
    gateway: Gateway,
) -> None:
    s = _stream(gateway)
    await s.handle(frames.post(CHAT, "k-acme"))
    await s.handle(frames.body(_chat(), end_of_stream=True))
    out = await s.handle(frames.response_headers(503, {"content-length": "91"}))
    mutation = out[0].response_headers.response.header_mutation
    assert frames.set_headers(mutation)["content-type"] == "application/json"
    assert "content-length" in mutation.remove_headers
    out = await s.handle(frames.response_body(b"upstream connect error", end_of_stream=True))
    body = json.loads(out[0].response_body.response.body_mutation.streamed_response.body)
    assert body["error"]["code"] == "upstream_connect"
    assert "n0" in gateway.pipeline.outlier.ejected()  # a connect failure ejects at once
    await s.close(cancelled=False)
    assert s.flow is not None and not s.flow.holds_reservation


async def test_over_the_hard_cap_is_429_with_retry_after(engine: EngineProcess) -> None:
    cfg = _config(engine, queue={"max_queue_tokens": 0})
    cfg["admission"]["tenants"][0]["hard_cap"] = 80  # one request (50 tokens) fits, two do not
    gw = Gateway(parse_config(cfg), registry=CollectorRegistry())
    await gw.start()
    try:
        holder = _stream(gw)
        await holder.handle(frames.post(CHAT, "k-acme"))
        out = await holder.handle(frames.body(_chat(), end_of_stream=True))
        assert out[0].WhichOneof("response") == "request_headers"
        s = _stream(gw)
        await s.handle(frames.post(CHAT, "k-acme"))
        out = await s.handle(frames.body(_chat(), end_of_stream=True))
        status, body = _error(out[0])
        assert status == 429
        assert body["error"]["type"] == "rate_limit_error"
        headers = frames.set_headers(out[0].immediate_response.headers)
        assert int(headers["retry-after"]) >= 1
        assert headers["x-kvgate-admission"].startswith("reject")
        await holder.close(cancelled=True)
        await s.close(cancelled=False)
    finally:
        await gw.stop()


async def test_a_queue_deadline_is_408(engine: EngineProcess) -> None:
    cfg = _config(engine, queue={"max_queue_tokens": 1000, "class_deadlines_s": {"interactive": 0}})
    cfg["admission"]["tenants"][0]["hard_cap"] = 80  # one request (50 tokens) fits
    gw = Gateway(parse_config(cfg), registry=CollectorRegistry())
    await gw.start()
    try:
        holder = _stream(gw)
        await holder.handle(frames.post(CHAT, "k-acme"))
        await holder.handle(frames.body(_chat(), end_of_stream=True))
        s = _stream(gw)
        await s.handle(frames.post(CHAT, "k-acme"))
        out = await s.handle(frames.body(_chat(), end_of_stream=True))
        status, body = _error(out[0])
        assert status == 408
        assert body["error"]["type"] == "timeout_error"
        await holder.close(cancelled=False)
        await s.close(cancelled=False)
    finally:
        await gw.stop()


async def test_an_engines_5xx_is_a_failed_attempt_relayed_as_sent(gateway: Gateway) -> None:
    s = _stream(gateway)
    await s.handle(frames.post(CHAT, "k-acme"))
    await s.handle(frames.body(_chat(), end_of_stream=True))
    errors = gateway.pipeline.metrics.upstream_errors.labels("n0", "http_5xx")
    before = errors._value.get()
    engine_said = {"x-envoy-upstream-service-time": "3", "content-type": "application/json"}
    out = await s.handle(frames.response_headers(503, engine_said))
    mutation = out[0].response_headers.response.header_mutation
    assert "content-length" not in mutation.remove_headers  # the engine's body stays
    out = await s.handle(frames.response_body(b'{"error": "busy"}', end_of_stream=True))
    assert out[0].response_body.response.body_mutation.streamed_response.body == (
        b'{"error": "busy"}'
    )
    assert errors._value.get() == before + 1
    assert s.flow is not None and not s.flow.holds_reservation
    await s.close(cancelled=False)
