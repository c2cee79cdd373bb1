"""The gateway's HTTP reading of typed admission decisions."""

from __future__ import annotations

import json

import pytest

from kvgate.admission.tenants import ClassNotAllowed, PriorityNotAllowed
from kvgate.gateway.admission_http import admission_header, not_allowed_error, rejection_error
from kvgate.types import AdmissionKind, AdmissionResult, RejectReason


@pytest.mark.parametrize(
    ("reason", "status", "error_type"),
    [
        (RejectReason.TOO_LARGE, 413, "invalid_request_error"),
        (RejectReason.DEADLINE, 408, "timeout_error"),
        (RejectReason.STORE_UNAVAILABLE, 503, "service_unavailable"),
        (RejectReason.QUEUE_FULL, 429, "rate_limit_error"),
    ],
)
def test_each_reject_reason_has_its_status(
    reason: RejectReason, status: int, error_type: str
) -> None:
    error = rejection_error(AdmissionResult(AdmissionKind.REJECT, reason, retry_after_s=2.2))
    assert error.status == status
    body = json.loads(error.response().body)  # type: ignore[arg-type]
    assert (body["error"]["type"], body["error"]["code"]) == (error_type, reason.value)
    assert error.headers["Retry-After"] == "3"
    assert error.headers["X-KVGate-Admission"].startswith(f"reject; reason={reason.value}")


def test_header_names_degrade_and_reservation() -> None:
    result = AdmissionResult(
        AdmissionKind.DEGRADE,
        "elastic",
        queued_seconds=0.25,
        reserved_tokens=300,
        degrade_to="economy_pool",
    )
    assert admission_header(result) == (
        "degrade; degrade=economy_pool; reason=elastic; queued_ms=250; reserved=300"
    )


def test_not_allowed_is_403_naming_the_header() -> None:
    cls = not_allowed_error(ClassNotAllowed("class 'batch' is not allowed"))
    prio = not_allowed_error(PriorityNotAllowed("priority 9 is above"))
    assert (cls.status, cls.code, cls.param) == (403, "class_not_allowed", "X-KVGate-Class")
    assert (prio.status, prio.code, prio.param) == (
        403,
        "priority_not_allowed",
        "X-KVGate-Priority",
    )
