"""A running gateway follows the active config version (hot reload, no restart).

On start the reloader runs the store's active version; with none yet it stores its own
effective config as version 1 (``bootstrap``), so the first ``kvgate config apply`` has
something to roll back to. It then watches ``/kvgate/config/active`` (and polls it every
``poll_s`` in case a watch breaks), and applies a new active version within a watch
round-trip. Applying: flags, routing (policy and parameters), admission (tenant quotas
through the store's quota keys, so the admission watch applies them; the rest of the
admission config in place; API keys), capacity profiles. A version that does not
validate against this process is refused and the replica keeps the one it runs
(``kvgate_config_reloads_total{result="invalid"}``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from kvgate.configver.document import document_of, validate_document
from kvgate.configver.versions import ACTIVE_KEY, ConfigVersion, VersionStore
from kvgate.gateway.config import ConfigError, GatewayConfig
from kvgate.store.keys import TOTAL_QUOTA, tenant_quota_key
from kvgate.tasks import cancel_all

log = logging.getLogger("kvgate.configver")


def apply_quota_value(gateway: Any, key: str, value: str) -> None:
    """Hand a quota key's value to the replica's admission layer, as its store watch would."""
    core = getattr(gateway.admission, "core", None)
    target = getattr(core, "book", core)  # the quota book, where the admission layer has one
    apply = getattr(target, "apply_store_value", None)
    if apply is not None:
        apply(key, value)


class ConfigMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.version = Gauge(
            "kvgate_config_version", "Config version this replica runs (0: none)", registry=registry
        )
        self.reloads = Counter(
            "kvgate_config_reloads",
            "Config versions applied by this replica, by result (applied | invalid | error)",
            ["result"],
            registry=registry,
        )


class ConfigReloader:
    def __init__(
        self,
        gateway: Any,  # kvgate gateway (duck-typed: config, flags, router, nodes, admission, store)
        *,
        author: str,
        on_applied: Callable[[GatewayConfig], None] | None = None,
        poll_s: float = 1.0,
    ) -> None:
        self.gateway = gateway
        self.author = author
        self.on_applied = on_applied
        self.poll_s = poll_s
        self.versions = VersionStore(gateway.store, process=gateway.config)
        self.metrics = ConfigMetrics(gateway.registry)
        self.running: int = 0
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        try:
            act = await self.versions.activation()
            if act is None:
                doc = document_of(self.gateway.config, self.gateway.flags)
                version = await self.versions.create(
                    doc, author=self.author, message="bootstrap: the file config"
                )
                # another replica may have bootstrapped at the same time: first one wins
                if await self.versions.activation() is None:
                    await self.versions.activate(
                        version.version, by=self.author, action="bootstrap"
                    )
            await self.reload()
        except Exception as exc:  # the gateway still serves its file config
            log.warning("config versions unavailable at start: %s", exc)
        self._tasks = [
            asyncio.create_task(self._watch(), name="config-watch"),
            asyncio.create_task(self._poll(), name="config-poll"),
        ]

    async def stop(self) -> None:
        await cancel_all(self._tasks)
        self._tasks = []

    async def _watch(self) -> None:
        while True:
            try:
                async for _event in self.gateway.store.watch_prefix(ACTIVE_KEY):
                    await self.reload()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("config watch interrupted: %s", exc)
            await asyncio.sleep(self.poll_s)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            with contextlib.suppress(Exception):
                await self.reload()

    # -- applying ----------------------------------------------------------------------
    async def reload(self) -> int:
        """Run the active version if it is not the one running; the version run."""
        async with self._lock:
            act = await self.versions.activation()
            if act is None or act.version == self.running:
                return self.running
            version = await self.versions.get(act.version)
            try:
                config = validate_document(version.document, self.gateway.config)
            except ConfigError as exc:
                self.metrics.reloads.labels("invalid").inc()
                log.error("config version %d refused: %s", version.version, exc)
                return self.running
            try:
                await self._apply(version, config)
            except Exception:
                self.metrics.reloads.labels("error").inc()
                log.exception("config version %d failed to apply", version.version)
                return self.running
            self.metrics.reloads.labels("applied").inc()
            log.info("config version %d now running (%s by %s)", act.version, act.action, act.by)
            return self.running

    async def _apply(self, version: ConfigVersion, new: GatewayConfig) -> None:
        gw = self.gateway
        old: GatewayConfig = gw.config
        for name, value in new.flags.items():
            gw.flags.set(name, value)
        # routing: parameters are read per decision from router.config / nodes.config
        gw.router.config = new.routing
        gw.nodes.config = new.routing
        if gw.router.policy_name != new.routing.policy:
            gw.router.set_policy(new.routing.policy)
        # admission: quotas travel through the store keys the admission layer watches
        await self._apply_tenants(old, new)
        if new.admission.total_quota != old.admission.total_quota:
            await gw.store.put(TOTAL_QUOTA, str(new.admission.total_quota))
            apply_quota_value(gw, TOTAL_QUOTA, str(new.admission.total_quota))
        gw.admission.config = new.admission
        core = getattr(gw.admission, "core", None)
        if core is not None and hasattr(core, "config"):
            core.config = new.admission
        from kvgate.admission.tenants import TenantDirectory

        gw.tenants = TenantDirectory(new.admission)
        gw.config = new
        self.versions.process = new
        if self.on_applied is not None:
            self.on_applied(new)
        self.running = version.version
        gw.config_version = version.version
        self.metrics.version.set(version.version)

    async def _apply_tenants(self, old: GatewayConfig, new: GatewayConfig) -> None:
        store = self.gateway.store
        names = {t.name for t in new.admission.tenants}
        values = {
            t.name: {"guaranteed": t.guaranteed, "weight": t.weight, "hard_cap": t.hard_cap}
            for t in new.admission.tenants
        }
        for t in old.admission.tenants:
            if t.name not in names:  # dropped from the config: back to the defaults
                values[t.name] = {"guaranteed": 0, "weight": 1.0, "hard_cap": None}
        for name, value in values.items():
            key, text = tenant_quota_key(name), json.dumps(value)
            await store.put(key, text)
            # also at once here: this replica's admission watch may not be running yet
            apply_quota_value(self.gateway, key, text)
