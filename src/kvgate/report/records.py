"""What one request's outcome looks like in a report."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    tenant: str
    node: str | None
    arrival: float  # seconds from the start of the run
    status: str  # "ok" | "rejected" | "error" | "degraded"
    http_status: int = 200
    ttft: float | None = None  # seconds from arrival to the first token
    e2e: float | None = None  # seconds from arrival to the last token
    tpot: float | None = None  # mean seconds per output token after the first
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # engine-reported
    expected_cached_tokens: int = 0  # the router's prediction
    queued_s: float = 0.0
    admission: str = "admit"  # the X-KVGate-Admission value (or an error code)
    route_reason: str | None = None  # X-KVGate-Route-Reason of the answering attempt
    priority_class: str = "interactive"  # picks the TTFT SLO that goodput is judged by
