"""``kvgate serve``: run the gateway. Command-line flags override the config file."""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import sys
from typing import Any

from kvgate.adapters import ENGINE_TYPES
from kvgate.cli import add_flag_option, add_log_level, configure_logging, flag_overrides
from kvgate.routing.policies import policy_names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE.yaml", help="gateway config file")
    parser.add_argument("--host", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="bind port (default 8000; 0 = any free port)")
    add_cluster_arguments(parser, id_default="host:port")
    parser.add_argument("--port-file", help="write the bound port here once listening")
    add_log_level(parser)
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="proxy worker processes sharing the port (default: number of cores); "
        "1 = everything in one process",
    )


def add_cluster_arguments(parser: argparse.ArgumentParser, *, id_default: str) -> None:
    """The engines, policy, store, admin token, replica id, scrape interval and flags:
    what ``kvgate serve`` and ``kvgate epp`` both override in the config file."""
    parser.add_argument(
        "--backend",
        action="append",
        default=[],
        metavar="URL",
        help="engine base URL; repeat for several (ids node-0, node-1, …)",
    )
    parser.add_argument(
        "--engine-type",
        default=None,
        choices=ENGINE_TYPES,
        help="engine type of --backend nodes (default: from the config, else vllm)",
    )
    parser.add_argument("--model", default=None, help="model of --backend nodes (else discovered)")
    parser.add_argument(
        "--policy",
        help="routing policy (default: the config's, else hybrid): "
        + ", ".join(sorted(policy_names())),
    )
    parser.add_argument("--store", help="memory:// | redis://h:p | etcd://h:p | redis://…,etcd://…")
    parser.add_argument("--admin-token", help="token for /admin and /dashboard")
    parser.add_argument("--gateway-id", help=f"this replica's id (default {id_default})")
    parser.add_argument("--scrape-interval", type=float, help="seconds between /metrics pulls")
    add_flag_option(parser)


def config_from_args(args: argparse.Namespace) -> dict[str, Any]:
    from kvgate.gateway.config import ConfigError, load_config

    data = load_config(args.config)
    server = dict(data.get("server") or {})
    for key, value in (("host", args.host), ("port", args.port), ("gateway_id", args.gateway_id)):
        if value is not None:
            server[key] = value
    if server:
        data["server"] = server
    if args.backend:
        nodes = []
        for i, url in enumerate(args.backend):
            node: dict[str, Any] = {"id": f"node-{i}", "url": url}
            if args.engine_type:
                node["engine_type"] = args.engine_type
            if args.model:
                node["model"] = args.model
            nodes.append(node)
        data["nodes"] = nodes
    routing = dict(data.get("routing") or {})
    if args.policy:
        routing["policy"] = args.policy
    if args.scrape_interval is not None:
        routing["scrape_interval_s"] = args.scrape_interval
    if routing:
        data["routing"] = routing
    if args.store:
        data["store"] = args.store
    if args.admin_token:
        data["auth"] = {**(data.get("auth") or {}), "admin_token": args.admin_token}
    flags = dict(data.get("flags") or {})
    try:
        flags.update(flag_overrides(args.flag))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if flags:
        data["flags"] = flags
    return data


def run(args: argparse.Namespace) -> int:

    from kvgate.gateway.app import create_app
    from kvgate.gateway.config import ConfigError, parse_config

    configure_logging(args.log_level, "%(asctime)s %(levelname)s %(name)s %(message)s")
    from kvgate.gateway.worker import bind_port
    from kvgate.gateway.workers import default_workers

    try:
        data = config_from_args(args)
        config = parse_config(data)
    except ConfigError as exc:
        print(f"kvgate serve: invalid config: {exc}", file=sys.stderr)
        return 2
    workers = default_workers() if args.workers is None else args.workers
    if workers < 1:
        print("kvgate serve: invalid --workers: must be at least 1", file=sys.stderr)
        return 2
    if not config.nodes:
        logging.getLogger("kvgate.gateway").warning(
            "no nodes configured; add them with POST /admin/nodes or a sidecar"
        )
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    # Port 0: bind first, so the gateway (its id, its leases) knows the port it serves on.
    reserved: socket.socket | None = None
    if config.server.port == 0:
        try:
            reserved = bind_port(config.server.host, 0, reuse_port=workers > 1)
        except OSError as exc:
            print(f"kvgate serve: cannot bind {config.server.host}: {exc}", file=sys.stderr)
            return 2
        config.server.port = int(reserved.getsockname()[1])
    try:
        app = create_app(config)
    except ValueError as exc:  # e.g. a tokenizer file that does not load
        print(f"kvgate serve: invalid config: {exc}", file=sys.stderr)
        return 2
    if workers == 1:
        asyncio.run(
            _serve(app, config.server.host, config.server.port, args.port_file, sock=reserved)
        )
    else:
        asyncio.run(
            _serve_workers(
                app, data, config, workers, args.port_file, args.log_level, reserved=reserved
            )
        )
    return 0


async def _serve_workers(
    app: Any,
    data: dict[str, Any],
    config: Any,
    workers: int,
    port_file: str | None,
    level: str,
    *,
    reserved: socket.socket | None = None,
) -> None:
    """One decision owner (this process) and ``workers`` proxy processes on one port."""
    from kvgate.gateway.workers import WorkerSet
    from kvgate.tasks import stop_on_signals

    group = WorkerSet(
        app,
        data,
        workers=workers,
        host=config.server.host,
        port=config.server.port,
        log_level=level,
        reserved=reserved,
    )
    stop = stop_on_signals()
    try:
        bound = await group.start()
        logging.getLogger("kvgate.gateway").info(
            "listening on http://%s:%s with %d workers", config.server.host, bound, workers
        )
        if port_file:
            with open(port_file, "w") as f:
                f.write(str(bound))
        await stop.wait()
    finally:
        await group.stop()


async def _serve(
    app: Any, host: str, port: int, port_file: str | None, *, sock: socket.socket | None = None
) -> None:
    from kvgate.gateway.front import serve_app
    from kvgate.tasks import serve_until_signalled

    runner, _site = await serve_app(app, host=host, port=port, sock=sock)
    bound = runner.addresses[0][1] if runner.addresses else port
    logging.getLogger("kvgate.gateway").info("listening on http://%s:%s", host, bound)
    if port_file:
        with open(port_file, "w") as f:
            f.write(str(bound))
    await serve_until_signalled(runner.cleanup)
