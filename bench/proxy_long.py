"""Long-prompt streamed workload for bench/proxy_overhead.py (``--workload long``).

Traffic: ``--system-prompts`` shared system prompts of ``--prompt-tokens`` tokens, each
request one of them (round-robin over a seeded shuffle) + a short unique question,
``stream: true``, ``max_tokens`` = ``--chunks`` with ``ignore_eos`` so every answer is
exactly that many SSE chunks. Every target gets the same request sequence.

The load client is a minimal HTTP/1.1 keep-alive client on asyncio streams (uvloop), so
the client's own CPU stays small next to the proxies it measures. TTFT = time from
sending the request to the first body bytes carrying ``data:``.

Phases, each run for every target in turn (direct first):

1. closed loop, ``--concurrency`` streams, ``--cpu-requests`` requests: proxy CPU
   µs/request (process tree, /proc utime+stime) and engine prefix-cache hit rate;
2. open loop at ``--rate`` req/s for ``--duration`` s: added TTFT p50/p99 vs direct;
3. open-loop ramp over ``--ramp`` rates: max req/s whose added p99 TTFT (vs direct at the
   same rate) stays within ``--p99-bound-ms`` with ≥ 97% of requests answered.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pstats
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvgate.procs.handle import terminate
from kvgate.tokens import synthetic_text

ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- process CPU ------------------------------------------------------------------------
def _tree(pid: int) -> list[int]:
    pids = [pid]
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            kids = Path(f"/proc/{pid}/task/{task}/children").read_text().split()
            for kid in kids:
                pids += _tree(int(kid))
    except OSError:
        pass
    return pids


def tree_cpu_seconds(pid: int, *, children: bool = True) -> float:
    """utime + stime of a process and (by default) all its live descendants."""
    total = 0
    for p in _tree(pid) if children else [pid]:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


# -- traffic ----------------------------------------------------------------------------
def build_bodies(args: argparse.Namespace, model: str) -> list[bytes]:
    rng = random.Random(args.seed)
    systems = [synthetic_text(args.prompt_tokens, rng) for _ in range(args.system_prompts)]
    order = list(range(args.system_prompts))
    bodies = []
    for i in range(args.pool):
        if i % len(order) == 0:
            rng.shuffle(order)
        system = systems[order[i % len(order)]]
        body = {
            "model": model,
            "stream": True,
            "max_tokens": args.chunks,
            "ignore_eos": True,
            "messages": [
                {"role": "system", "content": system},
                {
                    "role": "user",
                    "content": f"Question {i}: what does item {rng.randrange(10**6)} mean?",
                },
            ],
        }
        bodies.append(json.dumps(body).encode())
    return bodies


@dataclass
class Sample:
    ttft: list[float] = field(default_factory=list)
    errors: int = 0
    sent: int = 0
    wall: float = 0.0

    def pct(self, q: float) -> float:
        if not self.ttft:
            return float("nan")
        values = sorted(self.ttft)
        return values[min(len(values) - 1, int(q * len(values)))]


class Client:
    """Keep-alive HTTP/1.1 POSTs reading a chunked SSE answer to its end."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.host, self.port = host, int(port)
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()

    async def post(self, path: str, body: bytes) -> float | None:
        """TTFT in seconds, or None on an error."""
        if self.idle:
            reader, writer = self.idle.pop()
        else:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        t0 = time.perf_counter()
        writer.write(head + body)
        ttft = None
        tail = b""
        first = True
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    raise ConnectionError("closed")
                if first:
                    first = False
                    if not data.startswith(b"HTTP/1.1 200"):
                        raise ConnectionError(data[:200].decode(errors="replace"))
                if ttft is None and b"data:" in data:
                    ttft = time.perf_counter() - t0
                tail = (tail + data)[-7:]
                if tail == b"\r\n0\r\n\r\n":
                    break
        except (ConnectionError, OSError):
            writer.close()
            return None
        self.idle.append((reader, writer))
        return ttft


async def _closed_loop(url: str, bodies: list[bytes], n: int, concurrency: int) -> Sample:
    client, sample = Client(url), Sample()
    next_i = 0

    async def worker() -> None:
        nonlocal next_i
        while next_i < n:
            i = next_i
            next_i += 1
            sample.sent += 1
            ttft = await client.post("/v1/chat/completions", bodies[i % len(bodies)])
            if ttft is None:
                sample.errors += 1
            else:
                sample.ttft.append(ttft)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    sample.wall = time.perf_counter() - t0
    await client.close()
    return sample


async def _open_loop(
    url: str, bodies: list[bytes], rate: float, duration: float, offset: int
) -> Sample:
    client, sample = Client(url), Sample()
    n = int(rate * duration)
    tasks = []

    async def one(i: int) -> None:
        ttft = await client.post("/v1/chat/completions", bodies[(offset + i) % len(bodies)])
        if ttft is None:
            sample.errors += 1
        else:
            sample.ttft.append(ttft)

    loop = asyncio.get_running_loop()
    start = loop.time()
    for i in range(n):
        delay = start + i / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        sample.sent += 1
        tasks.append(asyncio.create_task(one(i)))
    _, pending = await asyncio.wait(tasks, timeout=duration + 30)
    for task in pending:
        task.cancel()
        sample.errors += 1
    sample.wall = loop.time() - start
    await client.close()
    return sample


def run_async(coro: Any) -> Any:
    import uvloop

    return uvloop.run(coro)


# -- processes --------------------------------------------------------------------------
@dataclass
class Proc:
    proc: subprocess.Popen[bytes]
    url: str
    tmp: tempfile.TemporaryDirectory[str]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        terminate(self.proc, 15)
        self.tmp.cleanup()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def spawn(
    args: list[str], *, health: bool = True, timeout: float = 40.0, src: str | None = None
) -> Proc:
    """Run ``args`` + ``--port-file F``; wait for the port (and /health).

    ``src``: import kvgate from this source tree instead (a baseline checkout).
    """
    tmp = tempfile.TemporaryDirectory(prefix="kvgate-bench-")
    port_file = Path(tmp.name) / "port"
    log = open(Path(tmp.name) / "log", "wb")  # noqa: SIM115
    env = {**os.environ, "PYTHONPATH": src} if src else None
    proc = subprocess.Popen([*args, "--port-file", str(port_file)], stdout=log, stderr=log, env=env)
    deadline = time.monotonic() + timeout
    while True:
        text = port_file.read_text().split() if port_file.exists() else []
        if text:
            url = f"http://127.0.0.1:{text[0]}"
            if not health or _healthy(url):
                return Proc(proc, url, tmp)
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{args[:4]} did not start: {(Path(tmp.name) / 'log').read_text()}")
        time.sleep(0.05)


def start_engine(args: argparse.Namespace) -> Proc:
    cmd = [sys.executable, "-m", "kvgate", "engine-sim", "--count", "1", "--base-port", "0"]
    cmd += ["--profile", args.engine_profile, "--time-scale", str(args.engine_time_scale)]
    cmd += ["--kv-blocks", str(args.kv_blocks), "--model", "sim"]
    return spawn(cmd)


# -- targets ----------------------------------------------------------------------------
@dataclass
class Target:
    name: str
    url: str
    pid: int | None  # None: direct to the engines (no proxy)
    stop: Callable[[], None]


def start_bare(engines: list[str]) -> Target:
    cmd = [sys.executable, str(ROOT / "bench" / "bare_proxy.py")]
    for e in engines:
        cmd += ["--backend", e]
    p = spawn(cmd, health=False)
    return Target("bare-aiohttp", p.url, p.pid, p.stop)


def start_kvgate(
    engines: list[str],
    policy: str,
    workers: int,
    python_args: list[str],
    *,
    src: str | None = None,
    name: str | None = None,
    more: list[str] | None = None,
) -> Target:
    extra = ["--policy", policy, "--log-level", "warning", "--engine-type", "sim"]
    extra += more or []
    # a baseline checkout may predate --workers (then it is one process anyway)
    if src is None or "--workers" in (Path(src) / "kvgate/gateway/cli.py").read_text():
        extra += ["--workers", str(workers)]
    launcher = python_args or ["-m"]
    cmd = [sys.executable, *launcher, "kvgate", "serve", "--host", "127.0.0.1"]
    cmd += ["--port", "0", *extra]
    for e in engines:
        cmd += ["--backend", e]
    p = spawn(cmd, src=src)
    return Target(name or f"kvgate-{policy}-w{workers}", p.url, p.pid, p.stop)


def _engine_cache(engines: list[str]) -> tuple[float, float]:
    hits = queries = 0.0
    for url in engines:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("vllm:prefix_cache_hits_total"):
                    hits += float(line.split()[-1])
                elif line.startswith("vllm:prefix_cache_queries_total"):
                    queries += float(line.split()[-1])
    return hits, queries


# -- the run ----------------------------------------------------------------------------
def add_long_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("long workload")
    g.add_argument("--engines", type=int, default=4)
    g.add_argument("--engine-profile", default="llama3-8b-h100")
    g.add_argument("--engine-time-scale", type=float, default=1.0)
    g.add_argument("--kv-blocks", type=int, default=2048)
    g.add_argument("--system-prompts", type=int, default=6)
    g.add_argument("--prompt-tokens", type=int, default=2000)
    g.add_argument("--chunks", type=int, default=48)
    g.add_argument("--pool", type=int, default=4000, help="distinct request bodies")
    g.add_argument("--seed", type=int, default=7)
    g.add_argument("--cpu-requests", type=int, default=900)
    g.add_argument("--cpu-concurrency", type=int, default=24)
    g.add_argument("--rounds", type=int, default=3, help="interleaved closed-loop rounds")
    g.add_argument("--rate", type=float, default=100.0, help="fixed rate for added TTFT")
    g.add_argument("--duration", type=float, default=5.0, help="seconds per open-loop run")
    g.add_argument("--ramp", type=float, nargs="*", default=[10, 25, 50, 100, 150, 200, 300])
    g.add_argument("--p99-bound-ms", type=float, default=50.0)
    g.add_argument(
        "--workers", type=int, nargs="+", default=[1, 2], help="kvgate hybrid worker counts"
    )
    g.add_argument("--rows", nargs="+", default=["bare", "round_robin", "hybrid"])
    g.add_argument("--profile", help="cProfile the kvgate hybrid (1 worker) gateway to FILE")
    g.add_argument(
        "--baseline-src",
        help="also run kvgate hybrid imported from this src/ tree (e.g. a checkout of main)",
    )
    g.add_argument("--profile-baseline", help="cProfile the baseline gateway to FILE")
    g.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=ARGS",
        help="one more kvgate hybrid (1 worker) row with extra serve arguments, "
        "e.g. 'noadm=--flag admission=off' (what a part costs)",
    )
    g.add_argument(
        "--cpu-only", action="store_true", help="only the closed-loop CPU phase (no TTFT, ramp)"
    )


@dataclass
class _CpuTally:
    cpu: float = 0.0
    own: float = 0.0
    ok: int = 0
    errors: int = 0
    wall: float = 0.0
    hits: float = 0.0
    queries: float = 0.0
    ttft: list[float] = field(default_factory=list)


def _phase_cpu(
    targets: list[Target], bodies: list[bytes], args: argparse.Namespace, engines: list[str]
) -> dict[str, dict[str, Any]]:
    """Closed loop, interleaved: ``--rounds`` rounds, each target in turn per round, so
    the shared machine's changing load falls on every target alike."""
    tally = {t.name: _CpuTally() for t in targets}
    per_round = max(1, args.cpu_requests // args.rounds)
    for r in range(args.rounds):
        for t in targets:
            assert t.pid is not None
            h0, q0 = _engine_cache(engines)
            cpu0, own0 = tree_cpu_seconds(t.pid), tree_cpu_seconds(t.pid, children=False)
            offset = r * per_round
            s = run_async(
                _closed_loop(
                    t.url, bodies[offset:] + bodies[:offset], per_round, args.cpu_concurrency
                )
            )
            x = tally[t.name]
            x.cpu += tree_cpu_seconds(t.pid) - cpu0
            x.own += tree_cpu_seconds(t.pid, children=False) - own0
            h1, q1 = _engine_cache(engines)
            x.hits, x.queries = x.hits + h1 - h0, x.queries + q1 - q0
            x.ok += s.sent - s.errors
            x.errors += s.errors
            x.wall += s.wall
            x.ttft += s.ttft
    out = {}
    for name, x in tally.items():
        ttft = sorted(x.ttft)
        out[name] = {
            # with workers: the decision owner's own share (admission, routing, IPC)
            "main_process_cpu_us_per_request": round(x.own / max(x.ok, 1) * 1e6, 1),
            "cpu_us_per_request": round(x.cpu / max(x.ok, 1) * 1e6, 1),
            "closed_loop_rps": round(x.ok / x.wall, 1),
            "closed_loop_ttft_p50_ms": round(ttft[len(ttft) // 2] * 1e3, 2) if ttft else None,
            "errors": x.errors,
            "engine_hit_rate": round(x.hits / x.queries, 4) if x.queries else None,
        }
    return out


def _profiler(out: str | None) -> list[str]:
    return [str(ROOT / "bench" / "cpu_profile.py"), out, "-m"] if out else []


def run_long(args: argparse.Namespace) -> int:
    engine_procs: list[Proc] = []
    targets: list[Target] = []
    results: dict[str, dict[str, Any]] = {}
    try:
        for _ in range(args.engines):
            engine_procs.append(start_engine(args))
        engines = [p.url for p in engine_procs]
        bodies = build_bodies(args, "sim")
        if "bare" in args.rows:
            targets.append(start_bare(engines))
        if args.baseline_src:
            py = _profiler(args.profile_baseline)
            targets.append(
                start_kvgate(
                    engines, "hybrid", 1, py, src=args.baseline_src, name="baseline-hybrid"
                )
            )
        for policy in ("round_robin", "hybrid"):
            if policy not in args.rows:
                continue
            for w in args.workers if policy == "hybrid" else [1]:
                profiling = args.profile and policy == "hybrid" and w == 1
                py = _profiler(args.profile) if profiling else []
                targets.append(start_kvgate(engines, policy, w, py))
        for variant in args.variant:
            label, _, more = variant.partition("=")
            targets.append(
                start_kvgate(engines, "hybrid", 1, [], name=f"kvgate-{label}", more=more.split())
            )
        # Direct: the engine-sims are one process per engine; spread over them through
        # a client per engine, i.e. what a perfect zero-cost round-robin proxy would do.
        direct = DirectSpread(engines)
        for t in targets:  # warm pools and caches
            run_async(_closed_loop(t.url, bodies, 48, 8))
        run_async(direct.closed(bodies, 48, 8))

        rows = {t.name: {} for t in targets}
        # 1. CPU per request, closed loop
        for name, row in _phase_cpu(targets, bodies, args, engines).items():
            rows[name].update(row)
            print(name, json.dumps(row), flush=True)
        if not args.cpu_only:
            _phase_latency(targets, bodies, args, direct, rows)
        results = rows
    finally:
        for t in targets:
            try:
                t.stop()
            except Exception as exc:  # keep stopping the others
                print(f"stopping {t.name}: {exc}", file=sys.stderr)
        for p in engine_procs:
            p.stop()
    _print_table(results)
    if args.profile:
        print_profile(args.profile)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


def _phase_latency(
    targets: list[Target],
    bodies: list[bytes],
    args: argparse.Namespace,
    direct: DirectSpread,
    rows: dict[str, dict[str, Any]],
) -> None:
    """Phases 2 (added TTFT at ``--rate``) and 3 (the ramp)."""
    # 2. added TTFT at the fixed rate (and CPU/request there)
    base = run_async(direct.open(bodies, args.rate, args.duration, 0))
    for t in targets:
        cpu0 = tree_cpu_seconds(t.pid) if t.pid else 0.0
        s = run_async(_open_loop(t.url, bodies, args.rate, args.duration, 0))
        cpu = tree_cpu_seconds(t.pid) - cpu0 if t.pid else 0.0
        rows[t.name].update(
            {
                f"cpu_us_per_request_at_{int(args.rate)}rps": round(
                    cpu / max(len(s.ttft), 1) * 1e6, 1
                ),
                "direct_ttft_p50_ms": round(base.pct(0.5) * 1e3, 2),
                "direct_ttft_p99_ms": round(base.pct(0.99) * 1e3, 2),
                "added_ttft_p50_ms": round((s.pct(0.5) - base.pct(0.5)) * 1e3, 2),
                "added_ttft_p99_ms": round((s.pct(0.99) - base.pct(0.99)) * 1e3, 2),
                "fixed_rate_errors": s.errors,
            }
        )
        print(t.name, json.dumps(rows[t.name]), flush=True)
    # 3. ramp
    alive = {t.name for t in targets}
    for t in targets:
        rows[t.name]["max_rps_within_bound"] = 0
    offset = 0
    for rate in args.ramp:
        if not alive:
            break
        offset += int(rate * args.duration)
        d = run_async(direct.open(bodies, rate, args.duration, offset))
        line = {"rate": rate, "direct_p99_ms": round(d.pct(0.99) * 1e3, 1)}
        for t in targets:
            if t.name not in alive:
                continue
            s = run_async(_open_loop(t.url, bodies, rate, args.duration, offset))
            added = (s.pct(0.99) - d.pct(0.99)) * 1e3
            answered = len(s.ttft) / max(s.sent, 1)
            line[t.name] = round(added, 1)
            if added <= args.p99_bound_ms and answered >= 0.97:
                rows[t.name]["max_rps_within_bound"] = rate
            else:
                alive.discard(t.name)
        print(json.dumps(line), flush=True)


class DirectSpread:
    """The client talks straight to the engines, spreading requests round-robin."""

    def __init__(self, engines: list[str]) -> None:
        self.engines = engines

    async def _split(self, runs: list[Any]) -> Sample:
        parts = await asyncio.gather(*runs)
        out = Sample()
        for p in parts:
            out.ttft += p.ttft
            out.errors += p.errors
            out.sent += p.sent
            out.wall = max(out.wall, p.wall)
        return out

    async def closed(self, bodies: list[bytes], n: int, concurrency: int) -> Sample:
        k = len(self.engines)
        return await self._split(
            [
                _closed_loop(url, bodies[i::k], n // k, max(1, concurrency // k))
                for i, url in enumerate(self.engines)
            ]
        )

    async def open(self, bodies: list[bytes], rate: float, duration: float, offset: int) -> Sample:
        k = len(self.engines)
        shifted = bodies[offset % len(bodies) :] + bodies[: offset % len(bodies)]
        return await self._split(
            [
                _open_loop(url, shifted[i::k], rate / k, duration, 0)
                for i, url in enumerate(self.engines)
            ]
        )


def _print_table(rows: dict[str, dict[str, Any]]) -> None:
    if not rows:
        return
    keys = sorted({k for r in rows.values() for k in r})
    print("\n| metric | " + " | ".join(rows) + " |")
    print("|---|" + "---|" * len(rows))
    for k in keys:
        print(f"| {k} | " + " | ".join(str(r.get(k)) for r in rows.values()) + " |")
    bare = rows.get("bare-aiohttp", {}).get("cpu_us_per_request")
    if bare:
        for name, r in rows.items():
            if r.get("cpu_us_per_request"):
                print(f"cpu ratio {name} / bare = {r['cpu_us_per_request'] / bare:.2f}")


def print_profile(path: str, top: int = 40) -> None:
    stats = pstats.Stats(path)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)


__all__ = ["add_long_arguments", "run_long", "statistics"]
