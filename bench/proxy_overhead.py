"""Gateway overhead: CPU µs per request and added latency vs going direct to the engine.

Two workloads:

* ``--workload short`` (default): one engine, one ``kvgate serve``; at each concurrency
  the same bounded number of small non-streamed chat requests direct and through the
  gateway, in the same run.
* ``--workload long``: 4 ``kvgate engine-sim`` processes; ≈2k-token prompts (a few shared
  system prompts + a short question), 48 streamed chunks each. Rows measured side by
  side on identical traffic: a bare aiohttp pass-through proxy (bench/bare_proxy.py, the
  Python floor), kvgate round_robin and kvgate hybrid (``--workers`` N each). Per row:
  proxy CPU µs/request, added TTFT p50/p99 vs direct at a fixed rate, and the highest
  offered rate whose added p99 TTFT stays within ``--p99-bound-ms``. See
  bench/proxy_long.py.

Proxy CPU comes from /proc/<pid>/stat (utime + stime) of the process and its children.

    .venv/bin/python bench/proxy_overhead.py --requests 400 --concurrency 1 16 64
    .venv/bin/python bench/proxy_overhead.py --workload long [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.proxy_long import add_long_arguments, run_long, spawn  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


async def run_load(url: str, model: str, n: int, concurrency: int, max_tokens: int) -> list[float]:
    latencies: list[float] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)
    connector = aiohttp.TCPConnector(limit=concurrency)

    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                body = {
                    "model": model,
                    "max_tokens": max_tokens,
                    "messages": [
                        {"role": "system", "content": "You are a benchmark."},
                        {"role": "user", "content": f"request number {i}"},
                    ],
                }
                t0 = time.perf_counter()
                async with session.post(url + "/v1/chat/completions", json=body) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"HTTP {r.status} from {url}")
                latencies.append(time.perf_counter() - t0)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


def model_of(url: str) -> str:
    with urllib.request.urlopen(url + "/v1/models", timeout=5) as r:
        return str(json.load(r)["data"][0]["id"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400, help="requests per run")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--engine-url", help="use this running engine instead of starting one")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1000.0,
        help="engine-sim time scale (high: the simulated engine adds little latency)",
    )
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--workload", choices=("short", "long"), default="short")
    add_long_arguments(parser)
    args = parser.parse_args()
    if args.workload == "long":
        return run_long(args)

    engine_proc = None
    if args.engine_url:
        engine_url = args.engine_url.rstrip("/")
    else:
        engine_cmd = [sys.executable, "-m", "kvgate", "engine-sim", "--count", "1"]
        engine_proc = spawn([*engine_cmd, "--base-port", "0", "--time-scale", str(args.time_scale)])
        engine_url = engine_proc.url
    serve = [sys.executable, "-m", "kvgate", "serve", "--host", "127.0.0.1", "--port", "0"]
    gateway = spawn([*serve, "--backend", engine_url, "--log-level", "warning", "--workers", "1"])
    results = []
    try:
        model = model_of(engine_url)
        asyncio.run(run_load(gateway.url, model, 20, 4, args.max_tokens))  # warm pools
        for c in args.concurrency:
            direct = asyncio.run(run_load(engine_url, model, args.requests, c, args.max_tokens))
            cpu0 = cpu_seconds(gateway.pid)
            t0 = time.perf_counter()
            via = asyncio.run(run_load(gateway.url, model, args.requests, c, args.max_tokens))
            wall = time.perf_counter() - t0
            cpu = cpu_seconds(gateway.pid) - cpu0
            row = {
                "concurrency": c,
                "requests": args.requests,
                "gateway_cpu_us_per_request": round(cpu / args.requests * 1e6, 1),
                "direct_p50_ms": round(statistics.median(direct) * 1000, 3),
                "gateway_p50_ms": round(statistics.median(via) * 1000, 3),
                "added_p50_ms": round(
                    (statistics.median(via) - statistics.median(direct)) * 1000, 3
                ),
                "p50_ratio": round(statistics.median(via) / statistics.median(direct), 3),
                "gateway_rps": round(args.requests / wall, 1),
            }
            results.append(row)
            print(json.dumps(row))
    finally:
        gateway.stop()
        if engine_proc is not None:
            engine_proc.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
