"""The sidecar loop: scrape one engine, smooth, decide its state, report it under a lease.

Each tick writes ``/kvgate/nodes/<id>`` (``NodeReport`` JSON with url, model and the
``state_hint`` chosen by ``NodeStateDecider``, plus ``pool``) with a TTL, so a sidecar
that dies takes its node out of the registry when the lease runs out. On stop (SIGTERM)
it reports ``quiescing``, waits for the engine's running and waiting requests to reach
zero (bounded by the drain timeout) and deletes the key.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass, field
from urllib.parse import urlparse

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge

from kvgate.adapters import ENGINE_TYPES, get_adapter
from kvgate.clock import Clock, SystemClock
from kvgate.report_window import ReportWindow
from kvgate.sidecar.decision import NodeStateDecider, SaturationPolicy
from kvgate.store.base import KVStore
from kvgate.store.keys import node_key
from kvgate.types import NodeReport, NodeState

log = logging.getLogger("kvgate.sidecar")


@dataclass(frozen=True, slots=True)
class SidecarConfig:
    engine_url: str
    engine_type: str
    node_id: str
    interval_s: float = 3.0
    lease_ttl_s: float | None = None  # default: 3 × interval (survives two missed ticks)
    model: str | None = None  # default: the first model the engine lists at /v1/models
    pool: str = "default"
    advertise_url: str | None = None  # the URL the gateway should use; default engine_url
    window_s: float = 15.0
    drain_timeout_s: float = 60.0
    drain_poll_s: float = 0.5
    scrape_timeout_s: float = 2.0
    policy: SaturationPolicy = field(default_factory=SaturationPolicy)

    def __post_init__(self) -> None:
        for name in ("engine_url", "advertise_url"):
            url = getattr(self, name)
            if url is None:
                continue
            parsed = urlparse(url)
            if parsed.scheme not in ("http", "https") or not parsed.netloc:
                raise ValueError(f"{name} must be an http(s) URL, got {url!r}")
        if self.engine_type not in ENGINE_TYPES:
            raise ValueError(f"engine_type must be one of {', '.join(ENGINE_TYPES)}")
        if not self.node_id or "/" in self.node_id:
            raise ValueError("node_id must be a non-empty name without '/'")
        for name in ("interval_s", "window_s", "drain_poll_s", "scrape_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.drain_timeout_s < 0:
            raise ValueError("drain_timeout_s must not be negative")
        if self.lease_ttl_s is not None and self.lease_ttl_s <= self.interval_s:
            raise ValueError("lease_ttl_s must be longer than interval_s")

    @property
    def ttl_s(self) -> float:
        return self.lease_ttl_s if self.lease_ttl_s is not None else 3 * self.interval_s

    @property
    def url(self) -> str:
        return (self.advertise_url or self.engine_url).rstrip("/")


class SidecarMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.scrapes = Counter(
            "kvgate_sidecar_scrapes_total",
            "Engine scrapes by result (ok, stale = failed or unparsable)",
            ["result"],
            registry=registry,
        )
        self.publishes = Counter(
            "kvgate_sidecar_publishes_total",
            "Reports written to the store by result (ok, error)",
            ["result"],
            registry=registry,
        )
        self.restarts = Counter(
            "kvgate_sidecar_engine_restarts_total",
            "Engine restarts detected (counter reset or process start time change)",
            registry=registry,
        )
        self.state = Gauge(
            "kvgate_sidecar_node_state",
            "1 for the state the sidecar currently asks for",
            ["state"],
            registry=registry,
        )
        self.last_report_age = Gauge(
            "kvgate_sidecar_last_report_age_seconds",
            "Seconds since the last report was written to the store",
            registry=registry,
        )
        self.waiting = Gauge(
            "kvgate_sidecar_engine_waiting", "Smoothed engine queue", registry=registry
        )
        self.kv_usage = Gauge(
            "kvgate_sidecar_engine_kv_usage", "Smoothed engine KV usage", registry=registry
        )

    def set_state(self, state: NodeState) -> None:
        for s in NodeState:
            self.state.labels(s.value).set(1.0 if s is state else 0.0)


class Sidecar:
    def __init__(
        self,
        config: SidecarConfig,
        store: KVStore,
        *,
        clock: Clock | None = None,
        registry: CollectorRegistry | None = None,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.clock = clock or SystemClock()
        self.registry = registry or CollectorRegistry()
        self.metrics = SidecarMetrics(self.registry)
        self.adapter = get_adapter(config.engine_type)
        self.window = ReportWindow(window_s=config.window_s)
        self.decider = NodeStateDecider(self.clock, config.policy)
        self.key = node_key(config.node_id)
        self.model = config.model
        self.last_raw: NodeReport | None = None
        self.last_published: NodeReport | None = None
        self._last_published_at: float | None = None
        self._session = session
        self._own_session = session is None
        self.metrics.last_report_age.set_function(self._report_age)
        self.metrics.set_state(NodeState.HEALTHY)

    def _report_age(self) -> float:
        if self._last_published_at is None:
            return float("inf")
        return max(0.0, self.clock.now() - self._last_published_at)

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    # ---- one tick ------------------------------------------------------------------

    async def tick(self) -> NodeReport:
        """Scrape, smooth, decide and publish once; returns what was published."""
        now = self.clock.now()
        raw = await self.adapter.scrape(
            self.session,
            self.config.engine_url,
            node_id=self.config.node_id,
            now=now,
            previous=self.last_raw,
            timeout_s=self.config.scrape_timeout_s,
        )
        self.last_raw = raw
        self.metrics.scrapes.labels("stale" if raw.stale else "ok").inc()
        if raw.counters_reset:
            self.metrics.restarts.inc()
            log.info("node %s: engine restarted; re-registering", self.config.node_id)
        smoothed = self.window.add(raw)
        previous_state = self.decider.state
        state = self.decider.observe(raw, smoothed)
        if state is not previous_state:
            log.info("node %s: %s -> %s", self.config.node_id, previous_state, state)
        if not raw.stale and self.model is None:
            self.model = await self._discover_model()
        report = smoothed if not raw.stale else raw
        report.state_hint = state
        report.url = self.config.url
        report.model = self.model or "default"
        report.engine_type = self.config.engine_type
        await self.publish(report)
        self.metrics.set_state(state)
        if not raw.stale:
            self.metrics.waiting.set(smoothed.waiting)
            self.metrics.kv_usage.set(smoothed.kv_usage)
        return report

    async def publish(self, report: NodeReport) -> None:
        body = json.loads(report.to_json())
        body["pool"] = self.config.pool  # NodeReport has no pool field; readers may use it
        try:
            await self.store.put(
                self.key, json.dumps(body, separators=(",", ":")), ttl=self.config.ttl_s
            )
        except Exception as exc:  # the store may be down; the next tick tries again
            self.metrics.publishes.labels("error").inc()
            log.warning("node %s: report not written (%s)", self.config.node_id, exc)
            return
        self.metrics.publishes.labels("ok").inc()
        self.last_published = report
        self._last_published_at = self.clock.now()

    async def _discover_model(self) -> str | None:
        url = self.config.engine_url.rstrip("/") + "/v1/models"
        try:
            timeout = aiohttp.ClientTimeout(total=self.config.scrape_timeout_s)
            async with self.session.get(url, timeout=timeout) as resp:
                if resp.status != 200:
                    return None
                data = await resp.json(content_type=None)
            return str(data["data"][0]["id"])
        except Exception as exc:
            log.debug("node %s: model discovery failed: %s", self.config.node_id, exc)
            return None

    # ---- lifecycle -----------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Register, report every interval until ``stop`` is set, then drain and leave."""
        try:
            await self.tick()
            log.info("node %s registered (%s)", self.config.node_id, self.config.url)
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.config.interval_s)
                if stop.is_set():
                    break
                await self.tick()
            await self.drain()
        finally:
            await self.close()

    async def drain(self) -> bool:
        """Quiesce, wait for in-flight requests to finish, deregister. True if drained."""
        self.decider.begin_drain()
        deadline = self.clock.now() + self.config.drain_timeout_s
        await self.tick()
        drained = self.decider.drained
        while not drained and self.clock.now() < deadline:
            await asyncio.sleep(min(self.config.drain_poll_s, self.config.interval_s))
            await self.tick()
            drained = self.decider.drained
        if not drained:
            log.warning("node %s: drain timed out; deregistering anyway", self.config.node_id)
        await self.deregister()
        return drained

    async def deregister(self) -> None:
        try:
            await self.store.delete(self.key)
            log.info("node %s deregistered", self.config.node_id)
        except Exception as exc:  # the lease expires on its own
            log.warning(
                "node %s: deregister failed (%s); lease will expire", self.config.node_id, exc
            )
