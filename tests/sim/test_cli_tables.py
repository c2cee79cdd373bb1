"""``kvgate sim`` prints its results at 80 columns; ``--wide`` keeps the one wide table."""

from __future__ import annotations

from kvgate.report.summary import table_rows
from kvgate.sim.cli import narrow_tables


def summary(scale: float) -> dict[str, object]:
    return {
        "ttft_p50_s": 0.0123 * scale,
        "ttft_p90_s": 1.5 * scale,
        "ttft_p99_s": 12.25 * scale,
        "tpot_p50_s": 0.0101,
        "e2e_p50_s": 2.5,
        "throughput_rps": 1234.5,
        "output_tokens_per_s": 123456.0 / scale,
        "goodput_tokens_per_s": 100000.0,
        "goodput_rps": 1000.25,
        "cache_hit_rate": 0.5,
        "predicted_hit_rate": 0.625,
        "node_load_cv": 0.1,
        "tenant_jain_fairness": 0.99,
        "queued": 12345,
        "rejected": 678,
        "degraded": 9,
        "lost": 0,
    }


def test_every_figure_is_shown_within_80_columns() -> None:
    results = {"round_robin": summary(1.0), "a-very-long-policy-name": summary(2.0)}
    rows = table_rows(results, baseline="round_robin")
    text = narrow_tables(rows)
    assert max(len(line) for line in text.splitlines()) <= 80
    cells = [
        c.strip() for line in text.splitlines() if line.startswith("| ") for c in line.split("|")
    ]
    for row in rows[1:]:  # every figure of the wide table appears
        for value in row:
            assert value in cells
    tables = text.count("| policy ")
    assert tables >= 4  # latency, throughput, cache and balance, admission (+ continuations)
    assert text.count("| a-very-long-policy-name |") == text.count("| round_robin ") == tables


def test_a_column_no_table_names_is_still_printed() -> None:
    rows = [["policy", "TTFT p50 (s)", "new figure"], ["hybrid", "0.100", "42"]]
    text = narrow_tables(rows)
    assert "other" in text and "| new figure |" in text and "|         42 |" in text
