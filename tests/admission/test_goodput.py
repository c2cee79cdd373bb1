"""Goodput: output tokens/s of requests that met their class's TTFT SLO."""

from __future__ import annotations

import pytest

from kvgate.report import RequestRecord, markdown_table, summarize
from kvgate.report.summary import parse_class_slos


def rec(i: int, cls: str, ttft: float | None, out: int, status: str = "ok") -> RequestRecord:
    return RequestRecord(
        f"r{i}", "t", "n", 0.0, status, ttft=ttft, e2e=10.0, output_tokens=out, priority_class=cls
    )


def test_goodput_counts_only_requests_within_their_class_slo() -> None:
    records = [
        rec(0, "interactive", 0.5, 100),  # met (1 s)
        rec(1, "interactive", 1.5, 100),  # missed
        rec(2, "batch", 20.0, 300),  # met (30 s)
        rec(3, "batch", 31.0, 300),  # missed
        rec(4, "premium", 2.5, 50),  # no class SLO: the fallback (3 s) applies
        rec(5, "interactive", None, 0, status="rejected"),
    ]
    s = summarize(records, duration_s=10.0, slo_ttft_s=3.0)
    assert s["output_tokens_per_s"] == pytest.approx(85.0)
    assert s["goodput_tokens_per_s"] == pytest.approx(45.0)
    assert s["goodput_rps"] == pytest.approx(0.3)
    assert s["goodput_tokens_per_s_by_class"] == pytest.approx(
        {"batch": 30.0, "interactive": 10.0, "premium": 5.0}
    )
    assert s["ttft_p99_s_by_class"]["interactive"] == pytest.approx(1.49)
    strict = summarize(records, duration_s=10.0, class_slos={"interactive": 0.1, "batch": 25})
    assert strict["goodput_tokens_per_s"] == pytest.approx(30.0)
    assert "goodput tok/s" in markdown_table({"run": s})


def test_class_slo_flags_override_the_defaults_and_name_bad_input() -> None:
    assert parse_class_slos([]) == {"interactive": 1.0, "batch": 30.0}
    assert parse_class_slos(["interactive=0.5,bulk=120"]) == {
        "interactive": 0.5,
        "batch": 30.0,
        "bulk": 120.0,
    }
    with pytest.raises(ValueError, match="'batch=soon'"):
        parse_class_slos(["batch=soon"])
