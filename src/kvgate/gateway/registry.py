"""The node registry and flags in the store: sidecar-registered nodes come and go live.

A sidecar writes ``/kvgate/nodes/<id>`` (NodeReport JSON) under a lease. The first report
of an unknown node adds it (no restart); each report updates the node view; when the lease
expires the key vanishes and the node is removed (sidecar-registered nodes) or marked
unreachable (configured nodes). Reports are re-stamped with this gateway's clock on
arrival because the sidecar's monotonic clock is not ours.

Flags under ``/kvgate/flags/<name>`` ("on" | "off") are applied as they change, so
several gateway replicas sharing a store keep the same switches.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from kvgate.clock import Clock
from kvgate.flags import FLAG_NAMES, Flags
from kvgate.gateway.metrics import GatewayMetrics
from kvgate.store.base import KVStore, WatchEvent
from kvgate.store.keys import FLAGS_PREFIX, NODES_PREFIX
from kvgate.types import NodeReport, NodeSpec, NodeState

if TYPE_CHECKING:
    from kvgate.routing.node_view import NodeView

log = logging.getLogger("kvgate.gateway.registry")


@dataclass(eq=False, kw_only=True)
class NodeRegistry:
    store: KVStore
    nodes: NodeView
    flags: Flags
    clock: Clock
    metrics: GatewayMetrics
    sources: dict[str, str]  # node id → "config" | "admin" | "registry" (read only here)
    add_node: Callable[[NodeSpec], None]  # the gateway's own add/remove keep its tables in step
    remove_node: Callable[[str], None]
    retry_s: float = 1.0
    _tasks: list[asyncio.Task[None]] = field(default_factory=list, init=False, repr=False)

    def handle_node_event(self, event: WatchEvent) -> None:
        node_id = event.key[len(NODES_PREFIX) :]
        if not node_id:
            return
        if event.value is None:
            self._node_gone(node_id)
            return
        try:
            report = NodeReport.from_json(event.value)
            pool = json.loads(event.value).get("pool") or "default"  # sidecars add it
        except (ValueError, TypeError, AttributeError) as exc:
            log.warning("ignoring malformed registry entry for %s: %s", node_id, exc)
            self.metrics.registry_events.labels("malformed").inc()
            return
        report = replace(report, node_id=node_id, timestamp=self.clock.now())
        if node_id not in self.sources:
            if not report.url:
                log.warning("registry entry for %s has no url; cannot route to it", node_id)
                self.metrics.registry_events.labels("malformed").inc()
                return
            spec = NodeSpec(
                node_id=node_id,
                url=report.url.rstrip("/"),
                model=report.model or "default",
                pool=str(pool),
                engine_type=report.engine_type,
                kv_capacity_tokens=report.kv_capacity_tokens,
            )
            self.add_node(spec)
            self.metrics.registry_events.labels("added").inc()
            log.info("node %s registered via store (%s)", node_id, spec.url)
        self.nodes.apply_report(report)  # the node view applies the sidecar's state hint
        self.metrics.registry_events.labels("report").inc()

    def _node_gone(self, node_id: str) -> None:
        source = self.sources.get(node_id)
        if source == "registry":
            self.remove_node(node_id)
            self.metrics.registry_events.labels("removed").inc()
            log.info("node %s left the registry (lease expired or deleted)", node_id)
        elif source is not None:
            self.nodes.set_state(node_id, NodeState.UNREACHABLE)
            self.metrics.registry_events.labels("expired").inc()

    def handle_flag_event(self, event: WatchEvent) -> None:
        name = event.key[len(FLAGS_PREFIX) :]
        if name not in FLAG_NAMES or event.value is None:
            return
        value = event.value.strip().lower()
        if value in ("on", "off", "true", "false", "1", "0"):
            self.flags.set(name, value in ("on", "true", "1"))

    async def _follow(self, prefix: str, handle: Callable[[WatchEvent], None]) -> None:
        while True:
            try:
                for key, value in (await self.store.get_prefix(prefix)).items():
                    handle(WatchEvent(key, value))
                async for event in self.store.watch_prefix(prefix):
                    handle(event)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # store down: keep the last view, try again
                log.warning("store watch on %s failed (%s); retrying", prefix, exc)
            await asyncio.sleep(self.retry_s)

    def start(self) -> None:
        if not self._tasks:
            self._tasks = [
                asyncio.create_task(self._follow(NODES_PREFIX, self.handle_node_event)),
                asyncio.create_task(self._follow(FLAGS_PREFIX, self.handle_flag_event)),
            ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
