"""``kvgate status`` output fits the terminal: all node columns when wide, a subset at 80."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from kvgate.status.cli import status_view


def _summary() -> dict[str, Any]:
    node = {
        "state": "healthy",
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "pool": "default",
        "running": 3,
        "waiting": 1,
        "inflight_requests": 4,
        "load": 0.52,
        "kv_usage": 0.31,
        "predicted_hit_rate": 0.62,
        "actual_hit_rate": 0.58,
        "cold_boost": 1.0,
        "report_age_s": 2.5,
    }
    return {
        "gateway": {"id": "127.0.0.1:8000", "policy": "hybrid", "store": "memory://"},
        "nodes": [{**node, "node_id": f"node-{i}"} for i in range(4)],
        "tenants": [],
        "admission": {},
    }


def _render(width: int) -> list[str]:
    console = Console(width=width, record=True, force_terminal=False)
    console.print(status_view(_summary(), console))
    return console.export_text().splitlines()


def test_80_columns_keep_whole_cells() -> None:
    lines = _render(80)
    assert all(len(line) <= 80 for line in lines)
    text = "\n".join(lines)
    assert "…" not in text  # no column squeezed into ellipses
    for word in ("node-3", "healthy", "31.0%", "58.0%"):
        assert word in text


def test_wide_terminal_shows_every_column() -> None:
    text = "\n".join(_render(220))
    for word in ("meta-llama/Llama-3.1-8B-Instruct", "cold boost", "report age"):
        assert word in text
