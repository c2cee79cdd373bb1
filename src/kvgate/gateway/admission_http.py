"""Admission decisions as HTTP: status, Retry-After, X-KVGate-Admission and the message.

Admission returns typed decisions (``kvgate.types.AdmissionResult``, ``RejectReason``);
this is the one place that says what each means on the wire.
"""

from __future__ import annotations

import math

from kvgate.admission.tenants import ClassNotAllowed, NotAllowed
from kvgate.gateway.errors import ApiError
from kvgate.pipeline.outcomes import admission_summary, reject_status
from kvgate.types import AdmissionResult, RejectReason

ADMISSION_HEADER = "X-KVGate-Admission"
PRIORITY_HEADER = "X-KVGate-Priority"
CLASS_HEADER = "X-KVGate-Class"

_MESSAGES: dict[str, str] = {
    RejectReason.TOO_LARGE: "the request needs more runtime tokens than its tenant may ever "
    "hold (prompt + max_tokens); lower max_tokens or shorten the prompt",
    RejectReason.DEADLINE: "request timed out in the admission queue",
    RejectReason.STORE_UNAVAILABLE: "admission unavailable (quota store down); retry later",
    RejectReason.QUEUE_FULL: "over quota (queue_full); retry later",
    RejectReason.OVERLOADED: "the engines are saturated: the request waited as long as its "
    "class may in the admission queue (overloaded); retry later",
}


def admission_header(result: AdmissionResult) -> str:
    """Value of the X-KVGate-Admission response header."""
    return admission_summary(result)


def rejection_error(result: AdmissionResult) -> ApiError:
    """The OpenAI-style error for a rejected request."""
    status = reject_status(result)
    message = _MESSAGES.get(result.reason, "")
    headers = {ADMISSION_HEADER: admission_header(result)}
    if result.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(result.retry_after_s)))
    return ApiError(
        status,
        message or f"over quota ({result.reason}); retry later",
        code=str(result.reason),
        headers=headers,
    )


def not_allowed_error(exc: NotAllowed) -> ApiError:
    """403 for a class or priority the tenant's key does not allow."""
    if isinstance(exc, ClassNotAllowed):
        return ApiError(403, str(exc), param=CLASS_HEADER, code="class_not_allowed")
    return ApiError(403, str(exc), param=PRIORITY_HEADER, code="priority_not_allowed")
