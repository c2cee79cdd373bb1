"""Tracing overhead: gateway CPU µs per request with tracing off, on at 10 %, on at 100 %.

One engine-sim and three ``kvgate serve --workers 1`` processes in front of it, identical
but for the ``tracing:`` section (off; ``sampling_ratio: 0.1``; ``1.0``), exporting to an
OTLP/HTTP sink in this process that answers 200. The same small non-streamed chat requests
(no client ``traceparent``, so the ratio decides) go through each gateway in turn, round
after round (the same run, interleaved, so drift hits every mode alike). Per mode: the
median over rounds of gateway CPU µs per request (every thread, the exporter's included:
/proc/<pid>/task/*/schedstat, ns resolution) and of p50 latency.

    .venv/bin/python bench/tracing_overhead.py --requests 400 --rounds 5 --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.proxy_long import spawn  # noqa: E402
from bench.proxy_overhead import model_of, run_load  # noqa: E402

MODES: dict[str, dict[str, Any] | None] = {
    "off": None,
    "on_10pct": {"enabled": True, "sampling_ratio": 0.1},
    "on_100pct": {"enabled": True, "sampling_ratio": 1.0},
}


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of ``pid`` (schedstat: ns resolution, not clock ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):  # a thread that just ended
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


class Sink:
    """Accepts OTLP/HTTP trace exports (POST /v1/traces) and counts the bytes."""

    def __init__(self) -> None:
        self.posts = 0
        self.bytes = 0
        self.port = 0
        self._ready = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()
        assert self._ready.wait(10)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        runner = web.AppRunner(app)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        loop.run_forever()

    async def _traces(self, request: web.Request) -> web.Response:
        self.bytes += len(await request.read())
        self.posts += 1
        return web.Response(body=b"", content_type="application/x-protobuf")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400, help="requests per mode per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--time-scale", type=float, default=1000.0)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()

    sink = Sink()
    tmp = tempfile.TemporaryDirectory(prefix="kvgate-trace-bench-")
    engine_cmd = [sys.executable, "-m", "kvgate", "engine-sim", "--count", "1", "--base-port"]
    engine = spawn([*engine_cmd, "0", "--time-scale", str(args.time_scale)])
    gateways = {}
    try:
        for mode, tracing in MODES.items():
            config: dict[str, Any] = {"nodes": [{"id": "e0", "url": engine.url}]}
            if tracing is not None:
                config["tracing"] = {**tracing, "endpoint": f"http://127.0.0.1:{sink.port}"}
            path = Path(tmp.name) / f"{mode}.yaml"
            path.write_text(yaml.safe_dump(config))
            serve = [sys.executable, "-m", "kvgate", "serve", "--host", "127.0.0.1", "--port", "0"]
            gateways[mode] = spawn(
                [*serve, "--config", str(path), "--log-level", "warning", "--workers", "1"]
            )
        model = model_of(engine.url)
        for gw in gateways.values():
            asyncio.run(run_load(gw.url, model, 50, 4, args.max_tokens))  # warm pools
        cpu: dict[str, list[float]] = {m: [] for m in MODES}
        p50: dict[str, list[float]] = {m: [] for m in MODES}
        for _ in range(args.rounds):
            for mode, gw in gateways.items():
                before = cpu_seconds(gw.pid)
                lat = asyncio.run(
                    run_load(gw.url, model, args.requests, args.concurrency, args.max_tokens)
                )
                time.sleep(0.3)  # the batch exporter's work for this round lands in it
                cpu[mode].append((cpu_seconds(gw.pid) - before) / args.requests * 1e6)
                p50[mode].append(statistics.median(lat) * 1000)
        off = statistics.median(cpu["off"])
        rows = []
        for mode in MODES:
            us = statistics.median(cpu[mode])
            row = {
                "mode": mode,
                "concurrency": args.concurrency,
                "requests": args.requests * args.rounds,
                "gateway_cpu_us_per_request": round(us, 1),
                "cpu_vs_off_pct": round((us / off - 1) * 100, 1),
                "p50_ms": round(statistics.median(p50[mode]), 3),
                "per_round_cpu_us": [round(x, 1) for x in cpu[mode]],
            }
            rows.append(row)
            print(json.dumps(row))
        print(json.dumps({"sink_posts": sink.posts, "sink_bytes": sink.bytes}))
    finally:
        for gw in gateways.values():
            gw.stop()
        engine.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
