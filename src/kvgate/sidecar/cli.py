"""``kvgate sidecar``: scrape one engine and report it to the store under a lease."""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import sys
from typing import Any

from prometheus_client import CollectorRegistry

from kvgate.adapters import ENGINE_TYPES
from kvgate.cli import add_log_level, configure_logging
from kvgate.sidecar.decision import SaturationPolicy
from kvgate.sidecar.sidecar import Sidecar, SidecarConfig
from kvgate.tasks import stop_on_signals

log = logging.getLogger("kvgate.sidecar")


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", required=True, metavar="URL", help="engine base URL")
    parser.add_argument(
        "--engine-type",
        required=True,
        choices=ENGINE_TYPES,
        help="which metrics adapter reads the engine's /metrics",
    )
    parser.add_argument(
        "--node-id", required=True, metavar="ID", help="this engine's node id in the store"
    )
    parser.add_argument(
        "--store", required=True, metavar="URL", help="redis://… | etcd://… (see kvgate.store)"
    )
    parser.add_argument("--interval", type=_positive, default=3.0, help="seconds between scrapes")
    parser.add_argument(
        "--lease-ttl", type=_positive, default=None, metavar="S", help="default 3 × interval"
    )
    parser.add_argument("--model", default=None, help="default: the engine's /v1/models")
    parser.add_argument(
        "--pool",
        default="default",
        metavar="P",
        help="pool this node belongs to (degrade sends work to the economy pool)",
    )
    parser.add_argument(
        "--advertise-url",
        default=None,
        metavar="URL",
        help="URL the gateway uses (default --engine)",
    )
    parser.add_argument("--window", type=_positive, default=15.0, help="smoothing window, s")
    parser.add_argument(
        "--drain-timeout",
        type=_non_negative,
        default=60.0,
        metavar="S",
        help="on SIGTERM: seconds to wait for in-flight requests while quiescing",
    )
    parser.add_argument(
        "--scrape-timeout",
        type=_positive,
        default=2.0,
        metavar="S",
        help="seconds before one /metrics scrape counts as failed",
    )
    parser.add_argument("--metrics-port", type=int, default=None, help="serve /metrics here")
    parser.add_argument("--metrics-host", default="127.0.0.1", help="bind address of /metrics")
    sat = parser.add_argument_group("saturation (backoff) thresholds")
    sat.add_argument(
        "--waiting-high",
        type=_non_negative,
        default=8.0,
        help="waiting requests at or above which the node enters backoff",
    )
    sat.add_argument(
        "--waiting-low",
        type=_non_negative,
        default=2.0,
        help="waiting requests at or below which it may recover",
    )
    sat.add_argument(
        "--kv-high",
        type=_non_negative,
        default=0.95,
        help="KV cache usage (0..1) at or above which the node enters backoff",
    )
    sat.add_argument(
        "--kv-low",
        type=_non_negative,
        default=0.85,
        help="KV cache usage at or below which it may recover",
    )
    sat.add_argument(
        "--preemptions-high",
        type=_non_negative,
        default=1.0,
        help="preemptions within one scrape at or above which the node enters backoff",
    )
    sat.add_argument(
        "--recover-hold",
        type=_non_negative,
        default=None,
        metavar="S",
        help="seconds below the low marks before leaving backoff (default 3 × interval)",
    )
    add_log_level(parser)


# Config field <- the option (its argparse dest) that sets it: builds the config and
# names the option in a config error.
_CONFIG_OPTIONS = {
    "engine_url": "engine",
    "engine_type": "engine_type",
    "node_id": "node_id",
    "interval_s": "interval",
    "lease_ttl_s": "lease_ttl",
    "model": "model",
    "pool": "pool",
    "advertise_url": "advertise_url",
    "window_s": "window",
    "drain_timeout_s": "drain_timeout",
    "scrape_timeout_s": "scrape_timeout",
}
_POLICY_OPTIONS = {
    name: name for name in ("waiting_high", "waiting_low", "kv_high", "kv_low", "preemptions_high")
}
_OPTION_OF_FIELD = {**_CONFIG_OPTIONS, **_POLICY_OPTIONS, "recover_hold_s": "recover_hold"}
_FIELD_NAMES = re.compile(r"\b(" + "|".join(_OPTION_OF_FIELD) + r")\b")


def _from_args(args: argparse.Namespace, options: dict[str, str]) -> dict[str, Any]:
    return {field: getattr(args, dest) for field, dest in options.items()}


def build_config(args: argparse.Namespace) -> SidecarConfig:
    """Raises ValueError naming the offending option."""
    interval = args.interval
    recover = args.recover_hold if args.recover_hold is not None else 3 * interval
    try:
        policy = SaturationPolicy(
            **_from_args(args, _POLICY_OPTIONS),
            recover_hold_s=recover,
            reregister_hold_s=2 * interval,
            unreachable_after_s=2 * interval,
        )
        return SidecarConfig(**_from_args(args, _CONFIG_OPTIONS), policy=policy)
    except ValueError as exc:
        raise ValueError(_option_name(str(exc))) from None


def _option_name(message: str) -> str:
    """Turn the field names in a config error into the CLI option names. The value the
    user gave (after ", got ") is echoed as given: a URL such as http://model-host/ must
    not have its words taken for field names."""
    text, got, value = message.partition(", got ")
    named = _FIELD_NAMES.sub(lambda m: "--" + _OPTION_OF_FIELD[m[1]].replace("_", "-"), text)
    return named + got + value


async def _serve_metrics(registry: CollectorRegistry, host: str, port: int) -> Any:
    from aiohttp import web
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


async def _main(config: SidecarConfig, store_url: str, args: argparse.Namespace) -> int:
    from kvgate.store import open_store

    store = open_store(store_url)
    registry = CollectorRegistry()
    sidecar = Sidecar(config, store, registry=registry)
    stop = stop_on_signals()
    runner = None
    if args.metrics_port is not None:
        runner = await _serve_metrics(registry, args.metrics_host, args.metrics_port)
    try:
        await sidecar.run(stop)
    finally:
        if runner is not None:
            await runner.cleanup()
        await store.close()
    return 0


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, "%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = build_config(args)
    except ValueError as exc:
        print(f"kvgate sidecar: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_main(config, args.store, args))
