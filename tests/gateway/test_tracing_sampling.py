"""The sampling decision of ``Tracing.request_span``: a request without a client
``traceparent`` is traced with the configured ratio (the rest make no span at all and send
an unsampled context on); a client's ``traceparent`` is followed, sampled or not."""

from __future__ import annotations

import re

import pytest

from kvgate.tracing import TraceSettings, Tracing, traceparent

W3C = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-0([01])$")
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def tracing_at(ratio: float) -> Tracing:
    # spans here are never ended, so nothing is exported to this closed port
    return Tracing(TraceSettings("http://127.0.0.1:9/v1/traces", ratio, "test"))


def test_the_ratio_decides_for_requests_without_a_client_context() -> None:
    assert tracing_at(0.0).request_span("POST /v1/x", {}, "r") is None
    always = tracing_at(1.0).request_span("POST /v1/x", {}, "r")
    assert always is not None and always.is_recording()
    some = tracing_at(0.25)
    traced = sum(some.request_span("POST /v1/x", {}, f"r{i}") is not None for i in range(4000))
    assert 0.21 < traced / 4000 < 0.29


@pytest.mark.parametrize("flag", ["01", "00"])
def test_a_client_context_is_followed_whatever_the_ratio(flag: str) -> None:
    headers = {"traceparent": f"00-{CLIENT_TRACE}-00f067aa0ba902b7-{flag}"}
    span = tracing_at(0.0 if flag == "01" else 1.0).request_span("POST /v1/x", headers, "r")
    assert span is not None
    assert span.is_recording() is (flag == "01")
    sent = traceparent(span)
    assert sent is not None
    match = W3C.match(sent)
    assert match is not None and match.group(1) == CLIENT_TRACE and match.group(3) == flag[1]


def test_an_unsampled_context_is_a_fresh_valid_traceparent() -> None:
    seen = {Tracing.unsampled_traceparent() for _ in range(100)}
    assert len(seen) == 100
    for value in seen:
        match = W3C.match(value)
        assert match is not None and match.group(3) == "0"
        assert set(match.group(1)) != {"0"} and set(match.group(2)) != {"0"}
