"""What the demo shows while a run is going: rich Live on a terminal, plain lines otherwise."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from typing import Any, TextIO

import aiohttp
from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.text import Text

from kvgate.loadgen.runner import BenchProgress
from kvgate.status.view import ADMISSION_KINDS, decision_counts, fmt_pct, summary_view

WIDTH = 80  # every line the demo prints fits a standard terminal


async def fetch_summary(session: aiohttp.ClientSession, gateway_url: str) -> dict[str, Any] | None:
    try:
        async with session.get(gateway_url + "/admin/summary") as resp:
            if resp.status == 200:
                data = await resp.json()
                return data if isinstance(data, dict) else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        pass
    return None


def with_real_address(summary: dict[str, Any], gateway_url: str) -> dict[str, Any]:
    """The gateway names itself by its configured address, port 0 when the OS picked
    the port; show the address the demo actually talks to."""
    g = summary.get("gateway")
    if isinstance(g, dict) and str(g.get("id", "")).endswith(":0"):
        summary = {**summary, "gateway": {**g, "id": gateway_url.removeprefix("http://")}}
    return summary


def _wrap(parts: list[str], indent: str = "  ") -> list[str]:
    """Join parts with two spaces into lines of at most ``WIDTH`` characters."""
    lines: list[str] = []
    line = ""
    for part in parts:
        if line and len(line) + 2 + len(part) > WIDTH:
            lines.append(line)
            line = ""
        line = f"{line}  {part}" if line else indent + part
    if line:
        lines.append(line)
    return lines


def plain_lines(label: str, elapsed: float, duration: float, progress: BenchProgress,
                summary: dict[str, Any] | None) -> list[str]:  # fmt: skip
    """Progress for a log or a pipe: a header line, then indented detail lines."""
    lines = [f"[{label}] {elapsed:5.1f}/{duration:.0f}s sent {progress.issued}/"
             f"{progress.total} done {progress.done}"]  # fmt: skip
    if summary:
        decisions = decision_counts((summary.get("admission") or {}).get("decisions_total"))
        queued = sum((t.get("queue_depth") or 0) for t in summary.get("tenants") or [])
        admission = " ".join(f"{k} {decisions.get(k, 0):g}" for k in ADMISSION_KINDS)
        lines += _wrap([f"admission: {admission}", f"queued {queued}"])
        lines += _wrap(
            [
                f"{node.get('node_id')} {node.get('state')} kv {fmt_pct(node.get('kv_usage'))}"
                f" hit {fmt_pct(node.get('actual_hit_rate'))}"
                for node in summary.get("nodes") or []
            ]
        )
    return lines


def _header(label: str, elapsed: float, duration: float, progress: BenchProgress) -> Group:
    line = Text()
    line.append(f" {label} ", style="bold reverse")
    line.append(f"  {elapsed:5.1f} / {duration:.0f} s   sent {progress.issued}/{progress.total}")
    line.append(f"   completed {progress.done}")
    done = min(elapsed / duration, 1.0) if duration else 1.0
    return Group(line, ProgressBar(total=1.0, completed=done, width=WIDTH - 20))


async def watch(
    label: str,
    gateway_url: str,
    duration: float,
    progress: BenchProgress,
    stop: asyncio.Event,
    *,
    live: bool,
    out: TextIO = sys.stdout,
    plain_every_s: float = 3.0,
) -> None:
    """Poll the summary each second until ``stop`` is set; render it."""
    start = time.monotonic()
    previous: tuple[float, dict[str, Any]] | None = None
    last_plain = 0.0
    timeout = aiohttp.ClientTimeout(total=2)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        view: Live | None = None
        if live:
            view = Live(console=Console(file=out), refresh_per_second=4, transient=False)
            view.start()
        try:
            while not stop.is_set():
                summary = await fetch_summary(session, gateway_url)
                if summary:
                    summary = with_real_address(summary, gateway_url)
                now = time.monotonic()
                elapsed = now - start
                if view is not None:
                    body: list[Any] = [_header(label, elapsed, duration, progress)]
                    if summary:
                        before = previous[1] if previous else None
                        seconds = now - previous[0] if previous else None
                        body.append(summary_view(summary, before, seconds, narrow=True))
                    view.update(Group(*body))
                elif now - last_plain >= plain_every_s:
                    for line in plain_lines(label, elapsed, duration, progress, summary):
                        print(line, file=out, flush=True)
                    last_plain = now
                if summary:
                    previous = (now, summary)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=1.0)
        finally:
            if view is not None:
                view.stop()
