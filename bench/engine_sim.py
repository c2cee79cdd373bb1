"""Benchmark the simulated engine.

1. HTTP: one ``kvgate engine-sim --count 8`` process at a high time scale under a
   closed-loop aiohttp load generator (short requests). Baseline in the same run: a bare
   aiohttp app answering a fixed JSON body with the same client, so the ratio shows what
   the engine model and OpenAI handling cost on top of aiohttp itself. Server CPU is read
   from /proc, so the figure is requests per second per core of the server process.
2. Model: ``EngineCore`` alone in virtual time (what the cluster simulator pays per
   request), projected to 1M requests.

    .venv/bin/python bench/engine_sim.py [--duration 10] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from kvgate.engine.core import EngineCore
from kvgate.engine.profiles import get_profile
from kvgate.engine.request import EngineRequest

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


async def load(urls: list[str], duration: float, concurrency: int, body: dict) -> tuple[int, int]:
    ok = errors = 0
    deadline = time.monotonic() + duration
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as session:

        async def worker(i: int) -> None:
            nonlocal ok, errors
            url = urls[i % len(urls)] + "/v1/completions"
            n = 0
            while time.monotonic() < deadline:
                n += 1
                payload = {**body, "prompt": f"{body['prompt']} {i} {n}"}
                async with session.post(url, json=payload) as resp:
                    await resp.read()
                    if resp.status == 200:
                        ok += 1
                    else:
                        errors += 1

        await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return ok, errors


def wait_ports(port_file: Path, proc: subprocess.Popen[bytes], timeout: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("engine-sim exited")
        if port_file.exists():
            return [int(x) for x in port_file.read_text().split()]
        time.sleep(0.05)
    raise RuntimeError("engine-sim did not start")


BASELINE_SCRIPT = """
import sys
from aiohttp import web
async def h(request):
    await request.read()
    return web.json_response({"id": "x", "choices": [{"text": "ok"}], "usage": {}})
app = web.Application()
app.router.add_post("/v1/completions", h)
import socket
sock = socket.socket(); sock.bind(("127.0.0.1", 0)); sock.listen(1024)
open(sys.argv[1] + ".tmp", "w").write(str(sock.getsockname()[1]) + "\\n")
import os; os.replace(sys.argv[1] + ".tmp", sys.argv[1])
try:
    import uvloop; uvloop.install()
except ImportError:
    pass
web.run_app(app, sock=sock, print=None, access_log=None)
"""


def run_http(args: argparse.Namespace, baseline: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "ports"
        if baseline:
            cmd = [sys.executable, "-c", BASELINE_SCRIPT, str(port_file)]
        else:
            cmd = [
                sys.executable, "-m", "kvgate", "engine-sim", "--count", str(args.engines),
                "--base-port", "0", "--port-file", str(port_file),
                "--time-scale", str(args.time_scale), "--profile", "gemma3-270m-cpu",
            ]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            ports = wait_ports(port_file, proc)
            urls = [f"http://127.0.0.1:{p}" for p in ports]
            body = {"prompt": "short benchmark prompt", "max_tokens": 4, "ignore_eos": True}
            asyncio.run(load(urls, 1.0, args.concurrency, body))  # warm-up
            cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
            ok, errors = asyncio.run(load(urls, args.duration, args.concurrency, body))
            wall, cpu = time.monotonic() - t0, cpu_seconds(proc.pid) - cpu0
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    return {"ok": ok, "errors": errors, "rps": ok / wall, "server_cpu": cpu / wall,
            "rps_per_core": ok / cpu if cpu else 0.0}  # fmt: skip


def run_model(n_requests: int, token_events: bool, rate: float = 20.0) -> dict[str, float]:
    """One engine in virtual time: Poisson arrivals at ``rate``/s, shared prefixes."""
    profile = get_profile("llama3-8b-h100")
    core = EngineCore(profile, token_events=token_events)
    rng = random.Random(7)
    prefixes = [[rng.getrandbits(64) for _ in range(64)] for _ in range(16)]
    t = 0.0
    events = 0
    running = 0
    started = time.process_time()
    for i in range(n_requests):
        t += rng.expovariate(rate)
        events += len(core.advance_to(t))
        running += len(core.scheduler.running)
        prompt = rng.randint(200, 2000)
        hashes = prefixes[rng.randrange(16)][: prompt // 32]
        core.add_request(EngineRequest(f"r{i}", prompt, hashes, rng.randint(50, 400)), t)
    while (nt := core.next_event_time()) is not None:
        events += len(core.advance_to(nt))
    cpu = time.process_time() - started
    s = core.stats()
    return {"requests": n_requests, "cpu_s": cpu, "us_per_request": cpu / n_requests * 1e6,
            "steps": s.steps, "events": events, "sim_seconds": core.now,
            "avg_running": running / n_requests,
            "projected_1m_s": cpu / n_requests * 1e6}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--engines", type=int, default=8)
    parser.add_argument("--time-scale", type=float, default=1000.0)
    parser.add_argument("--model-requests", type=int, default=50_000)
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, python {sys.version.split()[0]}")
    for token_events in (True, False):
        model = run_model(args.model_requests, token_events)
        print(
            f"model (token_events={token_events}): {model['requests']} requests, "
            f"{model['steps']} steps, {model['events']} events, {model['cpu_s']:.2f} s CPU = "
            f"{model['us_per_request']:.1f} us/request -> 1M requests ~ "
            f"{model['projected_1m_s']:.0f} s CPU"
        )
    for rate in (5.0, 20.0, 40.0):
        model = run_model(args.model_requests // 2, False, rate)
        print(
            f"model load sweep: {rate:g} req/s -> {model['avg_running']:.0f} running on "
            f"average, {model['us_per_request']:.0f} us/request"
        )
    base = run_http(args, baseline=True)
    sim = run_http(args, baseline=False)
    for name, r in (("baseline aiohttp", base), (f"engine-sim x{args.engines}", sim)):
        print(
            f"{name}: {r['ok']} ok, {r['errors']} errors, {r['rps']:.0f} req/s, "
            f"server CPU {r['server_cpu']:.2f} cores, {r['rps_per_core']:.0f} req/s per core"
        )
    print(
        f"ratio engine-sim / baseline (req/s per core): {sim['rps_per_core'] / base['rps_per_core']:.2f}"
    )
    return 0 if sim["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
