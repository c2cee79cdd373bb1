"""``kvgate status --gateway URL [--admin-token T] [--json]``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console, RenderableType
from rich.measure import Measurement

from kvgate.cli import add_gateway_arguments
from kvgate.status.client import SummaryError, fetch_summary
from kvgate.status.view import nodes_table, summary_view


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_gateway_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the raw summary JSON")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait (default 5)")


def run(args: argparse.Namespace) -> int:
    try:
        summary = fetch_summary(args.gateway, args.admin_token, timeout_s=args.timeout)
    except SummaryError as exc:
        print(f"kvgate status: {exc}", file=sys.stderr)
        return 1
    if args.json:
        json.dump(summary, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
        return 0
    console = Console()
    console.print(status_view(summary, console))
    return 0


def status_view(summary: dict[str, Any], console: Console) -> RenderableType:
    """All node columns when they fit the terminal, else the 80-column subset."""
    unbounded = console.options.update_width(10_000)
    wide = Measurement.get(console, unbounded, nodes_table(summary))
    return summary_view(summary, narrow=wide.maximum > console.width)
