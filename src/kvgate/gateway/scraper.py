"""Direct pull: every scrape interval, read each node's /metrics through its engine adapter."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import aiohttp

from kvgate.adapters import get_adapter
from kvgate.clock import Clock
from kvgate.gateway.metrics import GatewayMetrics
from kvgate.types import NodeReport, NodeSpec

if TYPE_CHECKING:
    from kvgate.routing.node_view import NodeView

log = logging.getLogger("kvgate.gateway.scraper")


@dataclass(eq=False, kw_only=True)
class Scraper:
    session: aiohttp.ClientSession
    nodes: NodeView
    specs: Callable[[], list[NodeSpec]]  # the nodes it pulls (not the sidecar-reported ones)
    clock: Clock
    metrics: GatewayMetrics
    interval_s: float
    timeout_s: float
    _previous: dict[str, NodeReport] = field(default_factory=dict, init=False, repr=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    async def scrape_node(self, spec: NodeSpec) -> NodeReport:
        adapter = get_adapter(spec.engine_type)
        report = await adapter.scrape(
            self.session,
            spec.url,
            node_id=spec.node_id,
            now=self.clock.now(),
            previous=self._previous.get(spec.node_id),
            timeout_s=self.timeout_s,
        )
        self.metrics.scrapes.labels(spec.node_id, "stale" if report.stale else "ok").inc()
        self._previous[spec.node_id] = report  # the adapter carries counters across stale ones
        try:
            self.nodes.apply_report(report)
        except KeyError:  # removed while the scrape was in flight
            self._previous.pop(spec.node_id, None)
        return report

    async def scrape_all(self) -> list[NodeReport]:
        specs = self.specs()
        known = {s.node_id for s in specs}
        for gone in set(self._previous) - known:
            del self._previous[gone]
        return list(await asyncio.gather(*(self.scrape_node(s) for s in specs)))

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.scrape_all()
            except Exception:  # one bad round must not stop scraping
                log.exception("scrape round failed")

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="kvgate-scraper")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


async def discover_model(session: aiohttp.ClientSession, base_url: str, timeout_s: float) -> str:
    """The first model id a backend lists at /v1/models (raises on failure)."""
    async with session.get(
        base_url + "/v1/models", timeout=aiohttp.ClientTimeout(total=timeout_s)
    ) as resp:
        resp.raise_for_status()
        data = await resp.json(content_type=None)
    return str(data["data"][0]["id"])
