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

from kvgate.demo.load import LoadProgress
from kvgate.status.view import ADMISSION_KINDS, decision_counts, fmt_pct, summary_view


async def fetch_summary(session: aiohttp.ClientSession, gateway_url: str) -> dict[str, Any] | None:
    try:
        async with session.get(gateway_url + "/admin/summary") as resp:
            if resp.status == 200:
                data = await resp.json()
                return data if isinstance(data, dict) else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        pass
    return None


def plain_line(label: str, elapsed: float, duration: float, progress: LoadProgress,
               summary: dict[str, Any] | None) -> str:  # fmt: skip
    parts = [f"[{label}] {elapsed:5.1f}/{duration:.0f}s sent {progress.sent}/{progress.total}"
             f" done {progress.done}"]  # fmt: skip
    if summary:
        decisions = decision_counts((summary.get("admission") or {}).get("decisions_total"))
        parts.append(" ".join(f"{k} {decisions.get(k, 0):g}" for k in ADMISSION_KINDS))
        for node in summary.get("nodes") or []:
            parts.append(
                f"{node.get('node_id')} {node.get('state')} kv {fmt_pct(node.get('kv_usage'))}"
                f" hit {fmt_pct(node.get('actual_hit_rate'))}"
            )
        queued = sum((t.get("queue_depth") or 0) for t in summary.get("tenants") or [])
        parts.append(f"queued {queued}")
    return " | ".join(parts)


def _header(label: str, elapsed: float, duration: float, progress: LoadProgress) -> Group:
    line = Text()
    line.append(f" {label} ", style="bold reverse")
    line.append(f"  {elapsed:5.1f} / {duration:.0f} s   sent {progress.sent}/{progress.total}")
    line.append(f"   completed {progress.done}")
    done = min(elapsed / duration, 1.0) if duration else 1.0
    return Group(line, ProgressBar(total=1.0, completed=done, width=60))


async def watch(
    label: str,
    gateway_url: str,
    duration: float,
    progress: LoadProgress,
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
                now = time.monotonic()
                elapsed = now - start
                if view is not None:
                    body: list[Any] = [_header(label, elapsed, duration, progress)]
                    if summary:
                        before = previous[1] if previous else None
                        seconds = now - previous[0] if previous else None
                        body.append(summary_view(summary, before, seconds))
                    view.update(Group(*body))
                elif now - last_plain >= plain_every_s:
                    print(plain_line(label, elapsed, duration, progress, summary), file=out,
                          flush=True)  # fmt: skip
                    last_plain = now
                if summary:
                    previous = (now, summary)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=1.0)
        finally:
            if view is not None:
                view.stop()
