"""What an admission decision means to a client, for both drivers.

Admission returns typed decisions (``AdmissionResult``, ``RejectReason``). The gateway
turns them into HTTP answers (``kvgate.gateway.admission_http``); the simulator records
the same status and summary per request, so both drivers describe a decision one way.
"""

from __future__ import annotations

from kvgate.types import AdmissionResult, RejectReason

# Rejections that are not "over quota, retry later" (429).
_REJECT_STATUS: dict[str, int] = {
    RejectReason.TOO_LARGE: 413,
    RejectReason.DEADLINE: 408,
    RejectReason.STORE_UNAVAILABLE: 503,
}


def reject_status(result: AdmissionResult) -> int:
    """The status a client gets for a rejected request."""
    return _REJECT_STATUS.get(result.reason, 429)


def admission_summary(result: AdmissionResult) -> str:
    """One line naming the decision (the X-KVGate-Admission value, logs, sim records)."""
    s = result.kind.value
    if result.degrade_to:
        s += f"; degrade={result.degrade_to}"
    s += f"; reason={result.reason}; queued_ms={result.queued_seconds * 1000:.0f}"
    if result.reserved_tokens:
        s += f"; reserved={result.reserved_tokens}"
    return s
