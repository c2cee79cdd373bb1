"""``kvgate bench``: a named workload, live, against any OpenAI-compatible endpoint.

Open loop by default: the workload's own arrival times (``--rate R`` rescales them to a
mean of R requests/s, ``--time-scale X`` divides them by X to match an engine-sim run
with the same time scale). ``--concurrency C`` is closed loop: C requests in flight.
Writes the simulator's report format (results.json/csv, requests.csv, report.md, PNG).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from kvgate.cli import UsageError, add_slo_arguments
from kvgate.loadgen.runner import BenchProgress, BenchResult, arrival_scale_for_rate, run_bench
from kvgate.tasks import cancel_and_wait
from kvgate.workloads import WORKLOAD_NAMES, Workload, generate_workload


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument(
        "--workload",
        required=True,
        choices=WORKLOAD_NAMES,
        help="generated request stream (docs/workloads.md)",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--rate", type=float, default=None, help="open loop at R requests/s")
    mode.add_argument("--concurrency", type=int, default=None, help="closed loop, C in flight")
    parser.add_argument("--duration", type=float, default=None, help="stop issuing after S s")
    parser.add_argument("--requests", type=int, default=None, help="issue at most N requests")
    parser.add_argument("--seed", type=int, default=0, help="workload RNG seed")
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a workload parameter (see docs/workloads.md); repeatable",
    )
    parser.add_argument(
        "--api-key",
        action="append",
        default=[],
        metavar="KEY|TENANT=KEY",
        help="bearer key for every request, or for one tenant's requests; repeatable",
    )
    parser.add_argument("--model", default=None, help="model name (default: first /v1/models)")
    parser.add_argument(
        "--time-scale", type=float, default=1.0, help="divide open-loop arrival times by X"
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="per-request seconds")
    parser.add_argument("--drain", type=float, default=None, help="wait for in-flight (s)")
    add_slo_arguments(parser)
    parser.add_argument("--label", default="live", help="row name in the report")
    parser.add_argument("--out", type=Path, default=None, help="write the report here")
    parser.add_argument("--json", action="store_true", help="print the JSON summary")


def _value(text: str) -> Any:
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def parse_params(items: list[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--param {item!r}: expected NAME=VALUE")
        params[name.replace("-", "_")] = _value(value)
    return params


def parse_api_keys(items: list[str]) -> tuple[str | None, dict[str, str]]:
    default: str | None = None
    per_tenant: dict[str, str] = {}
    for item in items:
        tenant, sep, key = item.partition("=")
        if sep and tenant and key:
            per_tenant[tenant] = key
        else:
            default = item
    return default, per_tenant


def build_workload(args: argparse.Namespace) -> Workload:
    return generate_workload(
        args.workload, seed=args.seed, requests=args.requests, **parse_params(args.param)
    )


class _Display:
    """A rich progress bar on a terminal; a plain line every few seconds otherwise."""

    def __init__(self, progress: BenchProgress, title: str, *, interval_s: float = 2.0) -> None:
        self.progress = progress
        self.title = title
        self.interval_s = interval_s
        self.tty = sys.stderr.isatty()
        self._task: asyncio.Task[None] | None = None

    def line(self) -> str:
        p = self.progress
        return (
            f"issued {p.issued}/{p.total} done {p.done} ok {p.ok} "
            f"rejected {p.rejected} degraded {p.degraded} errors {p.errors}"
        )

    async def _plain(self) -> None:
        start = time.monotonic()
        while True:
            await asyncio.sleep(self.interval_s)
            print(f"{self.title}: {time.monotonic() - start:6.1f}s {self.line()}", file=sys.stderr)

    async def _rich(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        columns = (
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[stats]}"),
        )
        with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
            task = bar.add_task(self.title, total=self.progress.total, stats="")
            try:
                while True:
                    bar.update(
                        task,
                        completed=self.progress.done,
                        total=self.progress.total,
                        stats=self.line(),
                    )
                    await asyncio.sleep(0.2)
            finally:
                bar.update(task, completed=self.progress.done, stats=self.line())

    def start(self) -> None:
        self._task = asyncio.create_task(self._rich() if self.tty else self._plain())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        if not self.tty:
            print(f"{self.title}: finished {self.line()}", file=sys.stderr)


async def bench_once(
    args: argparse.Namespace, workload: Workload, *, title: str = "bench"
) -> BenchResult:
    """Run one workload as the CLI arguments say (also used by bench/compare_live.py)."""
    scale = 1.0 / args.time_scale
    if args.rate is not None:
        scale = arrival_scale_for_rate(workload.items, args.rate)
    default_key, keys = parse_api_keys(args.api_key)
    progress = BenchProgress(total=len(workload.items))
    display = _Display(progress, title)
    display.start()
    try:
        return await run_bench(
            args.target,
            workload.items,
            concurrency=args.concurrency,
            arrival_scale=scale,
            duration_s=args.duration,
            max_requests=args.requests,
            api_key=default_key,
            api_keys=keys,
            model=args.model,
            request_timeout_s=args.timeout,
            drain_timeout_s=args.drain,
            progress=progress,
        )
    finally:
        await display.stop()


def summarize_result(
    result: BenchResult, slo_ttft_s: float, class_slos: dict[str, float] | None = None
) -> dict[str, Any]:
    from kvgate.report.summary import summarize

    summary = summarize(
        result.records,
        duration_s=result.duration_s,
        slo_ttft_s=slo_ttft_s,
        issued=result.issued,
        class_slos=class_slos,
    )
    summary["mode"] = result.mode
    summary["error_kinds"] = dict(result.errors)
    return summary


def _validate(args: argparse.Namespace) -> None:
    if args.rate is not None and args.rate <= 0:
        raise UsageError("--rate must be > 0")
    if args.concurrency is not None and args.concurrency < 1:
        raise UsageError("--concurrency must be >= 1")
    if args.requests is not None and args.requests < 1:
        raise UsageError("--requests must be >= 1")
    if args.duration is not None and args.duration <= 0:
        raise UsageError("--duration must be > 0")
    if args.time_scale <= 0:
        raise UsageError("--time-scale must be > 0")


def run(args: argparse.Namespace) -> int:
    from kvgate.report.summary import parse_class_slos

    _validate(args)
    try:
        workload = build_workload(args)
        class_slos = parse_class_slos(args.class_slo)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        result = asyncio.run(bench_once(args, workload, title=f"bench {args.workload}"))
    except (OSError, RuntimeError, aiohttp.ClientError) as exc:
        print(f"kvgate bench: {args.target}: {exc}", file=sys.stderr)
        return 1
    summary = summarize_result(result, args.ttft_slo, class_slos)
    results = {args.label: summary}
    if args.out is not None:
        from kvgate.report.writers import write_report

        meta = {
            "target": args.target,
            "workload": args.workload,
            "seed": args.seed,
            "mode": result.mode,
            "rate": args.rate,
            "concurrency": args.concurrency,
            "model": result.model,
            "command": "kvgate bench " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else "",
        }
        write_report(
            args.out,
            results,
            {args.label: result.records},
            f"kvgate bench: {args.workload} against {args.target}",
            meta=meta,
        )
    if args.json:
        print(json.dumps(results, indent=2, sort_keys=True))
    else:
        from kvgate.report.summary import markdown_table

        print(markdown_table(results))
        for msg, n in sorted(result.errors.items()):
            print(f"error x{n}: {msg}", file=sys.stderr)
    if summary["lost"] or (summary["completed"] == 0 and summary["errors"]):
        return 1
    return 0
