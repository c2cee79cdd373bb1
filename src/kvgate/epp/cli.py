"""``kvgate epp``: kvgate as the Endpoint Picker behind Envoy (ext_proc over gRPC).

The app is built as ``kvgate serve`` builds it (``kvgate.gateway.app.create_app``, the
same config file and overrides), so the picker holds the same router, admission,
pipeline, scraper and store as a gateway replica. Its HTTP port serves ``/metrics``,
``/health``, ``/admin/*`` and the dashboard from those objects; the gRPC port serves
Envoy's ``ExternalProcessor.Process``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Any

from kvgate.cli import add_log_level, configure_logging
from kvgate.gateway.cli import add_cluster_arguments

DEFAULT_GRPC_PORT = 9002
DEFAULT_HTTP_PORT = 9003

log = logging.getLogger("kvgate.epp")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE.yaml", help="gateway config file (as serve's)")
    parser.add_argument("--host", help="bind address of both ports (default 127.0.0.1)")
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_GRPC_PORT,
        help="ext_proc gRPC port Envoy calls (0 = any free port)",
    )
    parser.add_argument(
        "--http-port",
        type=int,
        default=DEFAULT_HTTP_PORT,
        help="/metrics, /health, /admin and the dashboard (0 = any free port)",
    )
    add_cluster_arguments(parser, id_default="host:http-port")
    parser.add_argument(
        "--port-file", help="write the gRPC and HTTP ports here (one a line) once listening"
    )
    add_log_level(parser)


def _serve_args(args: argparse.Namespace) -> argparse.Namespace:
    """The arguments as ``kvgate serve`` reads them (its --port is the HTTP port)."""
    return argparse.Namespace(**{**vars(args), "port": args.http_port})


def run(args: argparse.Namespace) -> int:
    from kvgate.gateway.app import create_app
    from kvgate.gateway.cli import config_from_args
    from kvgate.gateway.config import ConfigError, parse_config
    from kvgate.gateway.worker import bind_port

    configure_logging(args.log_level, "%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        import envoy.service.ext_proc.v3.external_processor_pb2  # noqa: F401
        import grpc  # noqa: F401
    except ImportError as exc:
        print(
            f"kvgate epp: {exc}; the picker needs the epp extra: pip install 'kvgate[epp]'",
            file=sys.stderr,
        )
        return 2
    try:
        config = parse_config(config_from_args(_serve_args(args)))
    except ConfigError as exc:
        print(f"kvgate epp: invalid config: {exc}", file=sys.stderr)
        return 2
    reserved = None
    if config.server.port == 0:  # bind first: the replica's id and leases name its port
        try:
            reserved = bind_port(config.server.host, 0, reuse_port=False)
        except OSError as exc:
            print(f"kvgate epp: cannot bind {config.server.host}: {exc}", file=sys.stderr)
            return 2
        config.server.port = int(reserved.getsockname()[1])
    try:
        app = create_app(config)
    except ValueError as exc:
        print(f"kvgate epp: invalid config: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve(app, config, args.port, args.port_file, reserved))
    except OSError as exc:
        print(f"kvgate epp: {exc}", file=sys.stderr)
        return 2
    return 0


async def _serve(
    app: Any, config: Any, grpc_port: int, port_file: str | None, reserved: Any
) -> None:
    from kvgate.epp.metrics import EppMetrics
    from kvgate.epp.servicer import start_grpc
    from kvgate.gateway.front import serve_app
    from kvgate.gateway.gateway import GATEWAY
    from kvgate.tasks import serve_until_signalled

    host = config.server.host
    runner, _site = await serve_app(app, host=host, port=config.server.port, sock=reserved)
    http_port = runner.addresses[0][1] if runner.addresses else config.server.port
    gateway = app[GATEWAY]
    server, bound = await start_grpc(gateway, EppMetrics(gateway.registry), host, grpc_port)
    log.info("ext_proc on %s:%s, http on http://%s:%s", host, bound, host, http_port)
    if port_file:
        with open(port_file, "w") as f:
            f.write(f"{bound}\n{http_port}\n")

    async def cleanup() -> None:
        await server.stop(grace=2.0)
        await runner.cleanup()

    await serve_until_signalled(cleanup)
