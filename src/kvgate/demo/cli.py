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
import time
from pathlib import Path
from types import FrameType
from typing import Any

import yaml
from rich.console import Console

from kvgate.demo.live import watch
from kvgate.demo.load import LoadProgress, replay
from kvgate.demo.processes import ChildFailed, ProcessGroup, wait_for_port_file
from kvgate.demo.report import write_report
from kvgate.demo.results import PolicyResult, comparison, comparison_table, summarise
from kvgate.demo.workload import WORKLOADS, DemoRequest, WorkloadSpec, generate

MODEL = "demo-model"
PROFILE = "gemma3-270m-cpu"
API_KEYS = {"interactive": "sk-demo-interactive", "batch": "sk-demo-batch"}
RUNS = (("round_robin", False), ("hybrid", True))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--duration", type=float, default=25.0, help="seconds of load per policy (default 25)"
    )
    parser.add_argument("--nodes", type=int, default=4, help="simulated engines (default 4)")
    parser.add_argument(
        "--workload", default="shared-prefix", choices=sorted(WORKLOADS), help="workload"
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
    """Two tenants: interactive users with a big guarantee, batch jobs with a small one."""
    return {
        "server": {"host": "127.0.0.1", "port": 0},
        "nodes": [
            {"id": f"node-{i}", "url": url, "model": MODEL, "engine_type": "vllm"}
            for i, url in enumerate(urls)
        ],
        "routing": {"policy": policy, "scrape_interval_s": 1.0},
        "admission": {
            "total_quota": 16000,
            "queue": {"class_deadlines_s": {"batch": 4.0}, "max_queue_tokens": 6000},
            "tenants": [
                {
                    "name": "interactive",
                    "api_keys": [API_KEYS["interactive"]],
                    "guaranteed": 9000,
                    "weight": 3,
                },
                {
                    "name": "batch",
                    "api_keys": [API_KEYS["batch"]],
                    "guaranteed": 2000,
                    "weight": 1,
                    "hard_cap": 6000,
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
        ports = wait_for_port_file(self.group, name, proc, port_file, self.args.nodes)
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
        (port,) = wait_for_port_file(self.group, name, proc, port_file, 1)
        return f"http://127.0.0.1:{port}"

    def run_policy(
        self, run: int, policy: str, admission: bool, requests: list[DemoRequest]
    ) -> PolicyResult:
        label = f"{policy}{' + admission' if admission else ''}"
        self.say(f"[bold]run {run + 1}/2[/bold]: starting {self.args.nodes} engines and a "
                 f"{label} gateway")  # fmt: skip
        before = set(self.group.pids())
        urls = self.start_engines(run)
        gateway = self.start_gateway(run, urls, policy, admission)
        progress = LoadProgress(total=len(requests))
        started = time.monotonic()
        asyncio.run(self._drive(label, gateway, requests, progress))
        wall = time.monotonic() - started
        for _, proc in [c for c in self.group.children if c[1].pid not in before]:
            self.group.stop(proc)
        result = summarise(policy, admission, progress.records, wall)
        self.say(
            f"  {label}: {result.ok}/{result.requests} completed, "
            f"TTFT p50 {result.ttft_p50_ms} ms, hit rate "
            f"{(result.token_hit_rate or 0) * 100:.1f}%, rejected {result.rejected}"
        )
        return result

    async def _drive(
        self, label: str, gateway: str, requests: list[DemoRequest], progress: LoadProgress
    ) -> None:
        stop = asyncio.Event()
        viewer = asyncio.create_task(
            watch(label, gateway, self.args.duration, progress, stop, live=self.live)
            if not self.args.json
            else stop.wait()
        )
        try:
            await replay(gateway, requests, API_KEYS, progress, request_timeout_s=30.0)
        finally:
            stop.set()
            await viewer

    def run(self) -> int:
        spec: WorkloadSpec = WORKLOADS[self.args.workload]
        requests = generate(spec, self.args.duration, MODEL, seed=self.args.seed)
        self.say(
            f"kvgate demo: workload [bold]{spec.name}[/bold] — {len(requests)} requests over "
            f"{self.args.duration:.0f} s, {spec.apps} apps sharing long system prompts, "
            f"2 tenants; {self.args.nodes} simulated engines ({PROFILE}, "
            f"{self.args.kv_blocks} KV blocks each, time scale {self.args.time_scale:g}×)"
        )
        results = [
            self.run_policy(i, policy, admission, requests)
            for i, (policy, admission) in enumerate(RUNS)
        ]
        baseline, candidate = results
        meta = {
            "workload": spec.name,
            "requests": len(requests),
            "duration_s": self.args.duration,
            "nodes": self.args.nodes,
            "engine_profile": PROFILE,
            "kv_blocks_per_node": self.args.kv_blocks,
            "time_scale": self.args.time_scale,
            "seed": self.args.seed,
        }
        report = write_report(Path(self.args.out), baseline, candidate, meta)
        if self.args.json:
            out = {
                "meta": meta,
                "results": [r.as_json() for r in results],
                "comparison": comparison(baseline, candidate),
                "report": str(report),
            }
            json.dump(out, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            self.console.print(comparison_table(baseline, candidate))
            self.say(f"HTML report: {report}")
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
    console = Console() if sys.stdout.isatty() else Console(width=120)
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
