"""Config versions and capacity profiles in a running gateway: admin endpoints + wiring.

``install(app)`` (one call in ``create_app``) attaches to the gateway:

* a ``ConfigReloader`` (the replica follows ``/kvgate/config/active``; the version it
  runs is ``gateway.config_version``, ``kvgate_config_version`` and ``/health``);
* a ``CapacityBook`` (nodes → calibrated capacity profiles; store profiles watched; the
  quota total follows the sum of the serving nodes' capacities; the dynamic quota
  measures capacity from it);
* the token-protected endpoints under ``/admin/config/…``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from kvgate.calibrate.book import CapacityBook
from kvgate.calibrate.profile import CAPACITY_PREFIX
from kvgate.configver import (
    VersionError,
    VersionStore,
    prepare_apply,
)
from kvgate.configver.live import ConfigReloader, apply_quota_value
from kvgate.forecast import attach as forecast_attach
from kvgate.forecast.samples import SAMPLE_TTL_S, MinuteSample, store_key
from kvgate.gateway.admin import _admin, _json_object
from kvgate.gateway.config import ConfigError, GatewayConfig
from kvgate.gateway.errors import ApiError
from kvgate.gateway.gateway import GATEWAY
from kvgate.store.keys import TOTAL_QUOTA
from kvgate.tasks import cancel_all

log = logging.getLogger("kvgate.gateway.config")

CAPACITY_SYNC_S = 1.0
RELOADER: web.AppKey[ConfigReloader] = web.AppKey("kvgate_config_reloader")


def _book_inputs(
    config: GatewayConfig,
) -> tuple[list[Any], dict[str, tuple[str | None, str | None]]]:
    profiles = [p.profile() for p in config.capacity_profiles]
    refs = {n.id: (n.model_version, n.deployment) for n in config.nodes}
    return profiles, refs


def install(app: web.Application) -> None:
    gateway: Any = app[GATEWAY]  # gains capacity_book and config_version
    profiles, refs = _book_inputs(gateway.config)
    book = CapacityBook(profiles, refs)
    book.register_metrics(gateway.registry, gateway.nodes.list)
    gateway.capacity_book = book
    gateway.config_version = 0
    dynamic = getattr(gateway.admission, "dynamic", None)
    if dynamic is not None:
        measured = dynamic.capacity

        def capacity() -> int | None:
            return book.total(gateway.nodes.list()) or (measured() if measured else None)

        dynamic.capacity = capacity
        dynamic.calibrated = lambda: bool(book.total(gateway.nodes.list()))
    sync = _CapacitySync(gateway, book)
    _attach_forecast(gateway)

    def applied(config: GatewayConfig) -> None:
        book.set_config(*_book_inputs(config))
        sync.written = None  # rewrite the calibrated total over a config's total_quota
        for listener in list(gateway.config_listeners):
            listener(config)

    reloader = ConfigReloader(
        gateway, author=f"gateway {gateway.config.gateway_id}", on_applied=applied
    )
    app[RELOADER] = reloader

    async def lifecycle(_: web.Application) -> AsyncIterator[None]:
        await reloader.start()
        await sync.start()
        yield
        await sync.stop()
        await reloader.stop()

    app.cleanup_ctx.append(lifecycle)
    add_routes(app)


def _attach_forecast(gateway: Any) -> None:
    """Per-minute samples of admitted-or-not arrivals → store; the dynamic quota's forecast.

    Arrivals are observed by the request pipeline (``RequestPipeline.admit``, the same
    observer as the simulator's); the forecast changes the quota only with flag
    ``forecast`` on.
    """
    admission = gateway.admission
    dynamic = getattr(admission, "dynamic", None)
    if dynamic is None:
        return
    store = gateway.store

    def sink(sample: MinuteSample) -> None:
        async def write() -> None:
            with contextlib.suppress(Exception):
                await store.put(store_key(sample.minute), sample.to_json(), ttl=SAMPLE_TTL_S)

        with contextlib.suppress(RuntimeError):  # no running loop (shutdown)
            asyncio.get_running_loop().create_task(write())

    gateway.forecast = forecast_attach.attach(
        dynamic,
        gateway.pipeline,
        gateway.flags,
        gateway.clock.now,
        lambda: int(gateway.config.admission.total_quota),
        sink=sink,
    )


class _CapacitySync:
    """Store profiles → book; the calibrated total → /kvgate/global/quota/total on change."""

    def __init__(self, gateway: Any, book: CapacityBook) -> None:
        self.gateway = gateway
        self.book = book
        self.written: int | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        with contextlib.suppress(Exception):
            for key, value in (await self.gateway.store.get_prefix(CAPACITY_PREFIX)).items():
                self.book.apply_store_value(key, value)
        await self.sync()
        self._tasks = [asyncio.create_task(self._loop()), asyncio.create_task(self._watch())]

    async def stop(self) -> None:
        await cancel_all(self._tasks)

    async def sync(self) -> None:
        total = self.book.total(self.gateway.nodes.list())
        if total and total != self.written:
            try:
                await self.gateway.store.put(TOTAL_QUOTA, str(total))
                apply_quota_value(self.gateway, TOTAL_QUOTA, str(total))
                self.written = total
            except Exception as exc:
                log.debug("cannot write the calibrated total: %s", exc)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(CAPACITY_SYNC_S)
            await self.sync()

    async def _watch(self) -> None:
        while True:
            try:
                async for event in self.gateway.store.watch_prefix(CAPACITY_PREFIX):
                    if self.book.apply_store_value(event.key, event.value):
                        await self.sync()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("capacity watch interrupted: %s", exc)
            await asyncio.sleep(CAPACITY_SYNC_S)


# -- endpoints -------------------------------------------------------------------------


def add_routes(app: web.Application) -> None:
    app.router.add_get("/admin/config/versions", list_versions)
    app.router.add_get("/admin/config/versions/{version}", get_version)
    app.router.add_get("/admin/config/diff", get_diff)
    app.router.add_post("/admin/config/apply", apply_config)
    app.router.add_post("/admin/config/rollback", rollback)
    app.router.add_get("/admin/config/baselines", list_baselines)
    app.router.add_post("/admin/config/baselines", mark_baseline)


def _versions(request: web.Request) -> tuple[Any, VersionStore]:
    gateway = _admin(request)
    return gateway, VersionStore(gateway.store, process=gateway.config)


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool):
        raise ApiError(400, f"{name} must be an integer", param=name, code="invalid_value")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ApiError(
            400, f"{name} must be an integer", param=name, code="invalid_value"
        ) from None


def _store_down(exc: Exception) -> ApiError:
    return ApiError(503, f"config store unavailable: {exc}", code="store_unavailable")


async def list_versions(request: web.Request) -> web.Response:
    gateway, versions = _versions(request)
    try:
        history = await versions.history()
        act = await versions.activation()
        baselines = await versions.baselines()
    except ConnectionError as exc:
        raise _store_down(exc) from None
    return web.json_response(
        {
            "running": gateway.config_version,
            "active": None if act is None else _activation(act),
            "versions": [v.header() for v in history],
            "baselines": baselines,
        }
    )


def _activation(act: Any) -> dict[str, Any]:
    return {
        "version": act.version,
        "by": act.by,
        "at": act.at,
        "action": act.action,
        "previous": act.previous,
    }


async def get_version(request: web.Request) -> web.Response:
    _, versions = _versions(request)
    raw = request.match_info["version"]
    try:
        version = await versions.resolve(None if raw == "active" else _int(raw, "version"))
    except VersionError as exc:
        raise ApiError(404, str(exc), code="version_not_found") from None
    except ConnectionError as exc:
        raise _store_down(exc) from None
    return web.json_response(version.detail())


async def get_diff(request: web.Request) -> web.Response:
    _, versions = _versions(request)
    query = request.query
    try:
        changes = await versions.changes(
            _int(query["from"], "from") if "from" in query else None,
            _int(query["to"], "to") if "to" in query else None,
        )
    except VersionError as exc:
        raise ApiError(404, str(exc), code="version_not_found") from None
    except ConnectionError as exc:
        raise _store_down(exc) from None
    return web.json_response(changes)


async def apply_config(request: web.Request) -> web.Response:
    gateway, versions = _versions(request)
    body = await _json_object(request)
    update = body.get("document")
    if not isinstance(update, dict):
        raise ApiError(
            400, "document must be a JSON object", param="document", code="invalid_value"
        )
    author = str(body.get("author") or "admin")
    message = str(body.get("message") or "")
    try:
        document, ignored = await prepare_apply(versions, update)
        version = await versions.apply(document, author=author, message=message)
    except ConfigError as exc:
        raise ApiError(
            400, f"invalid config: {exc}", param="document", code="invalid_config"
        ) from None
    except ConnectionError as exc:
        raise _store_down(exc) from None
    await request.app[RELOADER].reload()
    return web.json_response(
        {
            "version": version.header(),
            "diff": version.diff,
            "ignored": ignored,
            "running": gateway.config_version,
        },
        status=201,
    )


async def rollback(request: web.Request) -> web.Response:
    gateway, versions = _versions(request)
    body = await _json_object(request)
    to = _int(body["to"], "to") if body.get("to") is not None else None
    baseline = body.get("baseline")
    if baseline is not None and not isinstance(baseline, str):
        raise ApiError(400, "baseline must be a string", param="baseline", code="invalid_value")
    author = str(body.get("author") or "admin")
    try:
        act = await versions.rollback(by=author, to=to, baseline=baseline)
    except VersionError as exc:
        raise ApiError(404, str(exc), code="version_not_found") from None
    except ConfigError as exc:
        raise ApiError(409, f"version no longer valid here: {exc}", code="invalid_config") from None
    except ConnectionError as exc:
        raise _store_down(exc) from None
    await request.app[RELOADER].reload()
    return web.json_response({"active": _activation(act), "running": gateway.config_version})


async def list_baselines(request: web.Request) -> web.Response:
    _, versions = _versions(request)
    try:
        return web.json_response({"baselines": await versions.baselines()})
    except ConnectionError as exc:
        raise _store_down(exc) from None


async def mark_baseline(request: web.Request) -> web.Response:
    _, versions = _versions(request)
    body = await _json_object(request)
    name = body.get("name")
    if not isinstance(name, str):
        raise ApiError(400, "name must be a string", param="name", code="invalid_value")
    version = _int(body["version"], "version") if body.get("version") is not None else None
    author = str(body.get("author") or "admin")
    try:
        n = await versions.mark_baseline(name, by=author, version=version)
    except VersionError as exc:
        raise ApiError(400, str(exc), param="name", code="invalid_value") from None
    except ConnectionError as exc:
        raise _store_down(exc) from None
    return web.json_response({"name": name, "version": n}, status=201)
