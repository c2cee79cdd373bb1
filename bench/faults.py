"""Faults on the live path (issue 11): engines killed or frozen, clients that leave.

Each scenario starts fresh ``kvgate engine-sim`` processes (one per engine, so each can be
killed) and one ``kvgate serve`` on loopback, drives a steady load of chat requests (half
streamed), injects the fault and prints one table row:

  kill-1   SIGKILL 1 of 4 engines under load
  kill-3   SIGKILL 3 of 4 engines under load
  stop-1   SIGSTOP 1 of 4 engines for --stop-s seconds, then SIGCONT
  aborts   clients that leave: unary and streamed requests cut off, queued ones abandoned

Usage: .venv/bin/python bench/faults.py [--rate 30] [--seconds 6] [--stop-s 4]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

ADMIN = {"Authorization": "Bearer adm"}
MODEL = "sim"


@dataclass
class Proc:
    process: subprocess.Popen[bytes]
    url: str

    def signal(self, sig: int) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)


def _spawn(args: list[str], tmp: Path, name: str, timeout: float = 30.0) -> Proc:
    port_file = tmp / f"{name}.port"
    log = (tmp / f"{name}.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvgate", *args, "--port-file", str(port_file)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited: {(tmp / f'{name}.log').read_text()}")
        text = port_file.read_text().split() if port_file.exists() else []
        if text:
            return Proc(proc, f"http://127.0.0.1:{text[0]}")
        time.sleep(0.05)
    proc.kill()
    raise TimeoutError(f"{name} did not start")


@contextlib.contextmanager
def cluster(
    n: int, time_scale: float, gateway: dict[str, Any]
) -> Iterator[tuple[Proc, list[Proc]]]:
    procs: list[Proc] = []
    with tempfile.TemporaryDirectory(prefix="kvgate-faults-") as name:
        tmp = Path(name)
        try:
            for i in range(n):
                procs.append(
                    _spawn(
                        ["engine-sim", "--count", "1", "--base-port", "0", "--model", MODEL,
                         "--profile", "gemma3-270m-cpu", "--time-scale", str(time_scale)],
                        tmp, f"e{i}",
                    )
                )  # fmt: skip
            config = {
                "nodes": [
                    {"id": f"e{i}", "url": p.url, "model": MODEL} for i, p in enumerate(procs)
                ],
                "auth": {"admin_token": "adm"},
                **gateway,
            }
            (tmp / "gw.yaml").write_text(yaml.safe_dump(config))
            gw = _spawn(
                ["serve", "--config", str(tmp / "gw.yaml"), "--host", "127.0.0.1", "--port", "0"],
                tmp,
                "gateway",
            )
            procs.append(gw)
            _wait_healthy(gw.url)
            yield gw, procs[:-1]
        finally:
            for p in procs:
                p.signal(signal.SIGCONT)
                p.signal(signal.SIGTERM)
            for p in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.process.wait(timeout=10)
                if p.process.poll() is None:
                    p.process.kill()


def _wait_healthy(url: str) -> None:
    import urllib.request

    for _ in range(200):
        with contextlib.suppress(OSError), urllib.request.urlopen(url + "/health", timeout=1) as r:
            if r.status == 200:
                return
        time.sleep(0.05)
    raise TimeoutError("gateway not healthy")


@dataclass
class Result:
    sent: float
    stream: bool
    latency: float
    ok: bool


@dataclass
class Load:
    results: list[Result] = field(default_factory=list)


def _body(i: int, stream: bool, max_tokens: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "stream": stream,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "messages": [
            {"role": "system", "content": f"assistant {i % 64}"},
            {"role": "user", "content": f"hello number {i}"},
        ],
    }


async def _one(s: aiohttp.ClientSession, url: str, i: int, stream: bool, load: Load) -> None:
    sent = time.monotonic()
    ok = False
    try:
        async with s.post(url + "/v1/chat/completions", json=_body(i, stream, 24)) as r:
            data = await r.read()
            ok = r.status == 200 and (not stream or b'"error"' not in data)
    except aiohttp.ClientError:
        ok = False
    load.results.append(Result(sent, stream, time.monotonic() - sent, ok))


async def _drive(url: str, rate: float, seconds: float, load: Load) -> None:
    async with aiohttp.ClientSession() as s:
        tasks = []
        start = time.monotonic()
        i = 0
        while time.monotonic() - start < seconds:
            tasks.append(asyncio.create_task(_one(s, url, i, i % 2 == 1, load)))
            i += 1
            await asyncio.sleep(1.0 / rate)
        await asyncio.gather(*tasks)


async def _dispatches(s: aiohttp.ClientSession, url: str, node: str) -> float:
    async with s.get(url + "/metrics") as r:
        text = await r.text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("kvgate_dispatches_total{") and f'node="{node}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


async def _busiest(url: str, engines: list[Proc]) -> list[int]:
    """Engine indexes, most attempts first (the fault hits nodes that carry traffic)."""
    async with aiohttp.ClientSession() as s:
        counts = [await _dispatches(s, url, f"e{i}") for i in range(len(engines))]
    return sorted(range(len(engines)), key=lambda i: -counts[i])


async def _last_choice(url: str, node: str, seen: float, since: float, until: float) -> float:
    """Seconds after ``since`` of the last new attempt sent to ``node`` (sampled every
    50 ms; ``seen``: its attempts before ``since``)."""
    last = 0.0
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < until:
            await asyncio.sleep(0.05)
            now = await _dispatches(s, url, node)
            if now > seen:
                last, seen = time.monotonic() - since, now
    return last


def _p(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


async def kill(args: argparse.Namespace, victims: int) -> dict[str, Any]:
    with cluster(4, 50.0, {}) as (gw, engines):
        load = Load()
        driver = asyncio.create_task(_drive(gw.url, args.rate, args.seconds, load))
        await asyncio.sleep(args.seconds / 3)
        order = await _busiest(gw.url, engines)
        first = f"e{order[0]}"
        async with aiohttp.ClientSession() as s:
            before = await _dispatches(s, gw.url, first)
        for i in order[:victims]:
            engines[i].signal(signal.SIGKILL)
        killed = time.monotonic()
        watch = asyncio.create_task(
            _last_choice(gw.url, first, before, killed, killed + args.seconds * 2 / 3)
        )
        await driver
        last = await watch
    after = [r for r in load.results if r.sent >= killed]
    late = [r for r in load.results if r.sent >= killed + 1.0]
    return {
        "scenario": f"kill-{victims}",
        "requests": len(load.results),
        "unary failed": sum(1 for r in load.results if not r.stream and not r.ok),
        "unary failed, sent ≥1 s after": sum(1 for r in late if not r.stream and not r.ok),
        "streams failed": sum(1 for r in load.results if r.stream and not r.ok),
        "killed node last chosen (s after kill)": round(last, 2),
        "p99 latency after (s)": round(_p([r.latency for r in after], 0.99), 3),
    }


async def stop(args: argparse.Namespace) -> dict[str, Any]:
    cfg = {
        "server": {"first_byte_timeout_s": 1.0},
        "pipeline": {"outlier": {"probe_timeout_s": 0.3}},
    }
    with cluster(4, 50.0, cfg) as (gw, engines):
        load = Load()
        driver = asyncio.create_task(_drive(gw.url, args.rate, args.seconds + args.stop_s, load))
        await asyncio.sleep(args.seconds / 3)
        victim = (await _busiest(gw.url, engines))[0]
        engines[victim].signal(signal.SIGSTOP)
        stopped = time.monotonic()
        await asyncio.sleep(args.stop_s)
        engines[victim].signal(signal.SIGCONT)
        resumed = time.monotonic()
        async with aiohttp.ClientSession() as s:
            await asyncio.sleep(1.0)  # its next probe
            before = await _dispatches(s, gw.url, f"e{victim}")
            await driver
            back = await _dispatches(s, gw.url, f"e{victim}") > before
    during = [r for r in load.results if stopped - 0.5 <= r.sent <= resumed]
    return {
        "scenario": "stop-1",
        "requests": len(load.results),
        "unary failed": sum(1 for r in load.results if not r.stream and not r.ok),
        "streams failed": sum(1 for r in load.results if r.stream and not r.ok),
        "max unary latency while stopped (s)": round(
            max((r.latency for r in during if not r.stream), default=0.0), 3
        ),
        "bound: first-byte 1 s + probe 0.3 s + 1 retry": "1.3 s + retry",
        "stopped node back in rotation after SIGCONT": back,
    }


async def aborts(args: argparse.Namespace) -> dict[str, Any]:
    cfg = {"admission": {"total_quota": 4 * 2100, "queue": {"default_deadline_s": 60.0}}}
    with cluster(2, 1.0, cfg) as (gw, engines):
        async with aiohttp.ClientSession() as s:

            async def leave(i: int, stream: bool, after: float) -> None:
                with contextlib.suppress(TimeoutError, aiohttp.ClientError):
                    async with asyncio.timeout(after):
                        async with s.post(
                            gw.url + "/v1/chat/completions", json=_body(i, stream, 2000)
                        ) as r:
                            await r.read()

            waves = 5
            for w in range(waves):  # 4 fill the quota (2 unary, 2 streamed), 4 queue
                running = [
                    asyncio.create_task(leave(w * 10 + i, i % 2 == 1, 1.0)) for i in range(4)
                ]
                await asyncio.sleep(0.3)
                queued = [asyncio.create_task(leave(w * 10 + 5 + i, False, 0.3)) for i in range(4)]
                await asyncio.gather(*queued, *running)
            left = time.monotonic()
            baseline_s = None
            while time.monotonic() - left < 5.0:
                running_now = 0.0
                for e in engines:
                    async with s.get(e.url + "/metrics") as r:
                        for line in (await r.text()).splitlines():
                            if line.startswith("vllm:num_requests_running"):
                                running_now += float(line.rsplit(" ", 1)[1])
                async with s.get(gw.url + "/admin/summary", headers=ADMIN) as r:
                    summary = await r.json()
                inflight = sum(n["inflight_requests"] or 0 for n in summary["nodes"])
                if running_now == 0 and inflight == 0 and not summary["admission"]["used"]:
                    baseline_s = time.monotonic() - left
                    break
                await asyncio.sleep(0.05)
            async with s.get(gw.url + "/metrics") as r:
                metrics = await r.text()
    counts = {
        line.split('"')[1]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("kvgate_cancellations_total{")
    }
    admits = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("kvgate_admission_decisions_total{") and 'decision="admit"' in line
    )
    return {
        "scenario": "aborts",
        "aborted unary + streamed": waves * 4,
        "abandoned queued": waves * 4,
        "cancelled upstream": counts.get("upstream"),
        "dropped from queue": counts.get("queued"),
        "admitted in all": admits,
        "back to baseline (s)": None if baseline_s is None else round(baseline_s, 2),
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rate", type=float, default=30.0, help="requests/s (half streamed)")
    ap.add_argument("--seconds", type=float, default=6.0, help="load duration per scenario")
    ap.add_argument("--stop-s", type=float, default=4.0, help="SIGSTOP duration (stop-1)")
    ap.add_argument("--only", default="kill-1,kill-3,stop-1,aborts")
    args = ap.parse_args()
    wanted = args.only.split(",")
    runs = {
        "kill-1": lambda: kill(args, 1),
        "kill-3": lambda: kill(args, 3),
        "stop-1": lambda: stop(args),
        "aborts": lambda: aborts(args),
    }
    print(f"machine: {os.cpu_count()} cpu(s); rate {args.rate}/s, {args.seconds}s per scenario")
    for name in wanted:
        row = await runs[name]()
        print(" | ".join(f"{k}: {v}" for k, v in row.items()))


if __name__ == "__main__":
    asyncio.run(main())
