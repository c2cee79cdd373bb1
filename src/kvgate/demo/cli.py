"""``kvgate demo``: one command, nothing to start by hand.

Starts simulated engines and a gateway (in-memory store) as child processes, replays the
same generated workload through ``round_robin`` (admission off: the plain baseline) and
through ``hybrid`` (admission on, two tenants with API keys and different guarantees),
shows it live, then prints a side-by-side table and writes an HTML report.

The engines are restarted with empty caches before each run, so neither policy inherits
the other's warm cache.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

import yaml
from rich.console import Console

from kvgate.demo.live import watch
from kvgate.demo.processes import ProcessGroup
from kvgate.demo.table import comparison_rows, comparison_table
from kvgate.loadgen.runner import BenchProgress, run_bench
from kvgate.procs import ChildFailed, wait_for_ports
from kvgate.report import RequestRecord, summarize, write_report
from kvgate.workloads import WorkItem, Workload, generate_workload

MODEL = "demo-model"
PROFILE = "gemma3-270m-cpu"
API_KEYS = {"interactive": "sk-demo-interactive", "batch": "sk-demo-batch"}
RUNS = (("round_robin", False), ("hybrid", True))
# Variants of the ``apps`` workload (kvgate.workloads.apps) the demo offers.
VARIANTS: dict[str, dict[str, Any]] = {
    "shared-prefix": {},
    "light": {"rate": 3.0, "batch_burst": 3},
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--duration", type=float, default=25.0, help="seconds of load per policy (default 25)"
    )
    parser.add_argument("--nodes", type=int, default=4, help="simulated engines (default 4)")
    parser.add_argument(
        "--workload",
        default="shared-prefix",
        choices=sorted(VARIANTS),
        help="variant of the 'apps' workload (default shared-prefix)",
    )
    parser.add_argument(
        "--kv-blocks",
        type=int,
        default=640,
        help="KV blocks (16 tokens) per engine; below 'every app prompt on every node' "
        "so placement matters (default 640)",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=20.0,
        help=f"engines run the {PROFILE} profile this many times faster (default 20)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--out", default="kvgate-demo-report", help="report folder (default ./kvgate-demo-report)"
    )
    parser.add_argument("--seed", type=int, default=11, help="workload seed")


def gateway_config(urls: list[str], policy: str, admission: bool) -> dict[str, Any]:
    """Two tenants: interactive users with a big guarantee, batch jobs with a small one.

    Everything else is ``kvgate serve``'s defaults (dynamic total, prefill gate, queue,
    headroom fail-open): the demo shows what a new deployment gets. The guarantees are
    fractions, so they follow the dynamic total."""
    return {
        "server": {"host": "127.0.0.1", "port": 0},
        "nodes": [
            {"id": f"node-{i}", "url": url, "model": MODEL, "engine_type": "vllm"}
            for i, url in enumerate(urls)
        ],
        "routing": {"policy": policy, "scrape_interval_s": 1.0},
        "admission": {
            "tenants": [
                {
                    "name": "interactive",
                    "api_keys": [API_KEYS["interactive"]],
                    "guaranteed_fraction": 0.5,
                    "weight": 3,
                },
                {
                    "name": "batch",
                    "api_keys": [API_KEYS["batch"]],
                    "guaranteed_fraction": 0.1,
                    "weight": 1,
                    "default_class": "batch",
                },
            ],
        },
        "flags": {"admission": admission},
    }


class Demo:
    def __init__(self, args: argparse.Namespace, workdir: Path, console: Console) -> None:
        self.args = args
        self.workdir = workdir
        self.console = console
        self.group = ProcessGroup(workdir)
        self.live = sys.stdout.isatty() and not args.json

    def say(self, text: str) -> None:
        if not self.args.json:
            self.console.print(text, highlight=False)

    def start_engines(self, run: int) -> list[str]:
        port_file = self.workdir / f"engines-{run}.ports"
        name = f"engines-{run}"
        proc = self.group.start(
            name,
            ["engine-sim", "--count", str(self.args.nodes), "--base-port", "0",
             "--port-file", str(port_file), "--profile", PROFILE, "--model", MODEL,
             "--time-scale", str(self.args.time_scale), "--kv-blocks", str(self.args.kv_blocks)],
        )  # fmt: skip
        ports = wait_for_ports(
            proc, port_file, self.args.nodes, self.group.log_path(name), name=name
        )
        return [f"http://127.0.0.1:{p}" for p in ports]

    def start_gateway(self, run: int, urls: list[str], policy: str, admission: bool) -> str:
        config_path = self.workdir / f"gateway-{run}.yaml"
        config_path.write_text(yaml.safe_dump(gateway_config(urls, policy, admission)))
        port_file = self.workdir / f"gateway-{run}.port"
        name = f"gateway-{run}"
        proc = self.group.start(
            name,
            ["serve", "--config", str(config_path), "--port-file", str(port_file),
             "--log-level", "warning"],
        )  # fmt: skip
        (port,) = wait_for_ports(proc, port_file, 1, self.group.log_path(name), name=name)
        return f"http://127.0.0.1:{port}"

    def run_policy(
        self, run: int, policy: str, admission: bool, items: list[WorkItem]
    ) -> tuple[str, dict[str, Any], list[RequestRecord]]:
        label = f"{policy}{' + admission' if admission else ''}"
        self.say(f"[bold]run {run + 1}/2[/bold]: starting {self.args.nodes} engines and a "
                 f"{label} gateway")  # fmt: skip
        before = set(self.group.pids())
        urls = self.start_engines(run)
        gateway = self.start_gateway(run, urls, policy, admission)
        self.say(f"  gateway {gateway.removeprefix('http://')}")
        progress = BenchProgress(total=len(items))
        result = asyncio.run(self._drive(label, gateway, items, progress))
        for _, proc in [c for c in self.group.children if c[1].pid not in before]:
            self.group.stop(proc)
        nodes = [f"node-{i}" for i in range(self.args.nodes)]
        summary = summarize(
            result.records, duration_s=result.duration_s, issued=result.issued, node_ids=nodes
        )
        summary["admission"] = admission
        interactive = [r for r in result.records if r.tenant == "interactive"]
        summary["interactive_ttft_p99_s"] = summarize(interactive)["ttft_p99_s"]
        hit = summary["cache_hit_rate"]
        p50 = summary["ttft_p50_s"]
        self.say(
            f"  {summary['completed']}/{summary['requests']} completed, TTFT p50 "
            f"{'–' if p50 is None else f'{p50 * 1000:.0f} ms'}, hit rate "
            f"{(hit or 0) * 100:.1f}%, rejected {summary['rejected']}"
        )
        return label, summary, result.records

    async def _drive(
        self, label: str, gateway: str, items: list[WorkItem], progress: BenchProgress
    ) -> Any:
        stop = asyncio.Event()
        viewer = asyncio.create_task(
            watch(label, gateway, self.args.duration, progress, stop, live=self.live)
            if not self.args.json
            else stop.wait()
        )
        try:
            return await run_bench(
                gateway,
                items,
                api_keys=API_KEYS,
                model=MODEL,
                request_timeout_s=30.0,
                progress=progress,
            )
        finally:
            stop.set()
            await viewer

    def workload(self) -> Workload:
        return generate_workload(
            "apps",
            seed=self.args.seed,
            duration_s=self.args.duration,
            **VARIANTS[self.args.workload],
        )

    def run(self) -> int:
        workload = self.workload()
        items = workload.items
        apps = workload.params["apps"]
        self.say(
            f"kvgate demo: workload [bold]{self.args.workload}[/bold], {len(items)} "
            f"requests over {self.args.duration:.0f} s\n{apps} apps sharing long system "
            f"prompts, 2 tenants (interactive, batch)\n{self.args.nodes} simulated engines "
            f"({PROFILE}, {self.args.kv_blocks} KV blocks each, {self.args.time_scale:g}x "
            "time scale)"
        )
        runs = [
            self.run_policy(i, policy, admission, items)
            for i, (policy, admission) in enumerate(RUNS)
        ]
        results = {label: summary for label, summary, _ in runs}
        records = {label: recs for label, _, recs in runs}
        (base_label, baseline, _), (cand_label, candidate, _) = runs
        meta = {
            "workload": f"apps ({self.args.workload})",
            "requests": len(items),
            "duration_s": self.args.duration,
            "nodes": self.args.nodes,
            "engine_profile": PROFILE,
            "kv_blocks_per_node": self.args.kv_blocks,
            "time_scale": self.args.time_scale,
            "seed": self.args.seed,
        }
        title = f"kvgate demo: {cand_label} vs {base_label}"
        paths = write_report(
            Path(self.args.out), results, records, title, meta=meta, baseline=base_label
        )
        report = next(p for p in paths if p.name == "report.html")
        if self.args.json:
            out = {
                "meta": meta,
                "results": results,
                "comparison": comparison_rows(base_label, baseline, cand_label, candidate),
                "report": str(report),
            }
            json.dump(out, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            self.console.print(comparison_table(base_label, baseline, cand_label, candidate))
            self.say(f"report: {report}")
        return 0


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    if args.nodes < 1 or args.duration <= 0 or args.kv_blocks < 1 or args.time_scale <= 0:
        print(
            "kvgate demo: --nodes, --duration, --kv-blocks and --time-scale must be positive",
            file=sys.stderr,
        )
        return 2
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    console = Console(highlight=False)
    with tempfile.TemporaryDirectory(prefix="kvgate-demo-") as tmp:
        demo = Demo(args, Path(tmp), console)
        try:
            return demo.run()
        except KeyboardInterrupt:
            demo.group.stop_all()
            print("kvgate demo: interrupted; all child processes stopped", file=sys.stderr)
            return 130
        except ChildFailed as exc:
            print(f"kvgate demo: {exc}", file=sys.stderr)
            return 1
        finally:
            demo.group.stop_all()
            signal.signal(signal.SIGTERM, previous)
