"""The demo's live frame at 80 columns: every line fits and the gateway line is whole."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group

from kvgate.demo.live import WIDTH, _header, with_real_address
from kvgate.loadgen.runner import BenchProgress
from kvgate.status.view import summary_view


def _summary() -> dict[str, Any]:
    return {
        "gateway": {
            "id": "127.0.0.1:0",
            "policy": "hybrid",
            "store": "memory://",
            "uptime_s": 12,
            "auth_enabled": True,
            "flags": {"forecast": False},
        },
        "nodes": [
            {
                "node_id": f"node-{i}",
                "state": "healthy",
                "model": "demo-model",
                "running": 1,
                "waiting": 0,
                "load": 0.5,
                "kv_usage": 0.1,
                "predicted_hit_rate": 0.5,
                "actual_hit_rate": 0.4,
            }
            for i in range(4)
        ],
        "tenants": [],
        "admission": {"decisions_total": {"admit": 3}},
    }


def test_live_frame_fits_80_columns_and_names_the_real_port() -> None:
    summary = with_real_address(_summary(), "http://127.0.0.1:37765")
    console = Console(width=WIDTH, record=True, force_terminal=False)
    progress = BenchProgress(total=48, issued=10, done=8)
    console.print(
        Group(_header("hybrid + admission", 3.0, 8, progress), summary_view(summary, narrow=True))
    )
    lines = console.export_text().splitlines()
    assert all(len(line) <= WIDTH for line in lines), [x for x in lines if len(x) > WIDTH]
    gateway = [line for line in lines if "gateway" in line]
    assert gateway and gateway[0].startswith("gateway 127.0.0.1:37765  policy hybrid")
    text = " ".join(lines)
    assert "auth API keys" in " ".join(text.split())
    assert "flags off forecast" in text
    bar = lines[1]
    assert set(bar.strip()) <= set("━╸╺"), bar  # the bar has its own line
