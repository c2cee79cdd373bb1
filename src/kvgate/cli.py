"""The ``kvgate`` command: each subcommand lives in the module that owns it.

A subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from kvgate import __version__
from kvgate.flags import FLAG_NAMES, KNOWN_FLAGS

DESCRIPTION = """\
kvgate: a gateway for distributed LLM inference. It puts OpenAI-compatible engines
(vLLM, SGLang, TGI, llama.cpp) behind one endpoint, routes each request to where its
prompt prefix is already cached, and admits work against one cluster-wide quota."""

EPILOG = """\
quick start:
  kvgate demo                      simulated engines + gateway + workload, one command
  kvgate engine-sim --count 4 --base-port 8001
  kvgate serve --port 8000 --backend http://127.0.0.1:8001 --backend ...
  kvgate COMMAND --help            the options of one command

docs: README.md, docs/configuration.md, docs/operations.md"""


class UsageError(Exception):
    """A subcommand's arguments do not make sense together: ``kvgate`` prints
    "kvgate COMMAND: message" and exits 2, as argparse does for its own checks."""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" only where it informs: not for unset (None), on/off switches,
    empty lists, or help text that already states its default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if "default" in text or default is None or isinstance(default, bool) or default in ([], ""):
            return text
        return super()._get_help_string(action)


SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("kvgate.gateway.cli", "run the gateway (OpenAI-compatible proxy)"),
    "engine-sim": ("kvgate.engine.cli", "run simulated OpenAI-compatible engines"),
    "sidecar": ("kvgate.sidecar.cli", "scrape an engine and report it to the store"),
    "sim": ("kvgate.sim.cli", "compare policies in the virtual-time cluster simulator"),
    "bench": ("kvgate.loadgen.cli", "live load against an OpenAI-compatible endpoint"),
    "demo": ("kvgate.demo.cli", "engines + gateway + workload in one command"),
    "status": ("kvgate.status.cli", "show a running gateway's nodes and tenants"),
    "calibrate": ("kvgate.calibrate.cli", "load-test one engine: latency knee → capacity profile"),
    "config": ("kvgate.configver.cli", "versioned config: show, diff, apply, rollback, baselines"),
    "epp": ("kvgate.epp.cli", "Endpoint Picker for Envoy (ext_proc): admit and route per request"),
}


def add_gateway_arguments(parser: argparse.ArgumentParser) -> None:
    """``--gateway URL`` and ``--admin-token``, for commands that call the admin API."""
    parser.add_argument(
        "--gateway",
        default=os.environ.get("KVGATE_GATEWAY", "http://127.0.0.1:8000"),
        metavar="URL",
        help="gateway base URL (default $KVGATE_GATEWAY or http://127.0.0.1:8000)",
    )
    parser.add_argument(
        "--admin-token",
        default=os.environ.get("KVGATE_ADMIN_TOKEN"),
        help="admin token (default $KVGATE_ADMIN_TOKEN)",
    )


def add_slo_arguments(parser: argparse.ArgumentParser) -> None:
    """``--ttft-slo`` and ``--class-slo``: the TTFT SLOs goodput counts against
    (``kvgate.report.summary.parse_class_slos`` reads ``--class-slo``)."""
    parser.add_argument(
        "--ttft-slo", type=float, default=2.0, help="goodput TTFT SLO (s) of unnamed classes"
    )
    parser.add_argument(
        "--class-slo",
        action="append",
        default=[],
        help="CLASS=SECONDS TTFT SLO for goodput (default interactive=1,batch=30), repeatable",
    )


LOG_LEVELS = ("debug", "info", "warning", "error")


def add_log_level(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", default="info", choices=LOG_LEVELS, help="log verbosity")


def configure_logging(level: str, fmt: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), format=fmt)


def add_flag_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--flag",
        action="append",
        default=[],
        metavar="NAME=on|off",
        help="turn one strategy on or off; repeatable; NAME one of " + KNOWN_FLAGS,
    )


def flag_overrides(values: list[str]) -> dict[str, bool]:
    """``--flag NAME=on|off`` values as flag overrides; ValueError naming the bad one."""
    out: dict[str, bool] = {}
    for item in values:
        name, _, value = item.partition("=")
        if name not in FLAG_NAMES or value not in ("on", "off"):
            raise ValueError(
                f"--flag {item!r}: expected NAME=on|off with NAME one of {KNOWN_FLAGS}"
            )
        out[name] = value == "on"
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvgate",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"kvgate {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(
            name,
            help=help_text,
            description=help_text,
            formatter_class=HelpFormatter,
        )
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                p.set_defaults(_missing=module_name)
                continue
            raise
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if getattr(args, "_missing", None):
        print(f"kvgate {args.command}: not available in this build", file=sys.stderr)
        return 2
    try:
        return int(args._run(args) or 0)
    except UsageError as exc:
        print(f"kvgate {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
