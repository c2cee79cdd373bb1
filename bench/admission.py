"""Admission decision cost: decisions/s and p50/p99 decision latency, memory vs Redis.

Starts its own ``redis-server`` on a free loopback port. For each store it runs the same
bounded workload through one ``AdmissionController``: sequential admit/release pairs
(latency of one decision, i.e. one ``admit()``) and then ``--concurrency`` tasks doing
admit → release (throughput per gateway; each counted decision includes its release). The in-process memory store is the baseline
in the same run; Redis figures are also given as ratios to it.

    .venv/bin/python bench/admission.py --decisions 5000 --concurrency 32
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry

from kvgate.admission.config import AdmissionConfig
from kvgate.admission.controller import AdmissionController
from kvgate.flags import Flags
from kvgate.procs.ports import free_port
from kvgate.store import open_store
from kvgate.types import AdmissionKind, AdmissionRequest

CONFIG = {
    "total_quota": 10_000_000,
    "tenants": [{"name": f"t{i}", "guaranteed": 100_000, "weight": 1 + i % 3} for i in range(8)],
}
_ids = itertools.count()


def request(i: int) -> AdmissionRequest:
    return AdmissionRequest(f"b{next(_ids)}", f"t{i % 8}", "interactive", 200 + i % 50, 128)


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """A throwaway redis-server on a free loopback port (no persistence); yields its URL."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="kvgate-bench-redis-") as tmp:
        proc = subprocess.Popen(
            [shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind",
             "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", tmp],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.2) as c:
                        c.sendall(b"PING\r\n")
                        if c.recv(16).startswith(b"+PONG"):
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("redis-server did not start")
                time.sleep(0.05)
            yield f"redis://127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_store(url: str, decisions: int, concurrency: int) -> dict[str, Any]:
    store = open_store(url)
    c = AdmissionController(
        AdmissionConfig.model_validate(CONFIG), store, flags=Flags(), registry=CollectorRegistry()
    )
    await c.start()
    try:
        for i in range(200):  # warm-up (script load, connection)
            await c.release(await c.admit(request(i)))
        latencies: list[float] = []
        for i in range(decisions):
            t0 = time.perf_counter()
            result = await c.admit(request(i))
            latencies.append(time.perf_counter() - t0)
            assert result.kind is AdmissionKind.ADMIT, result
            await c.release(result)

        per_task = max(1, decisions // concurrency)

        async def worker(w: int) -> None:
            for i in range(per_task):
                await c.release(await c.admit(request(w * per_task + i)))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        elapsed = time.perf_counter() - t0

        held: list[Any] = []

        async def admit_only(w: int) -> None:
            for i in range(per_task):
                held.append(await c.admit(request(w * per_task + i)))

        t0 = time.perf_counter()
        await asyncio.gather(*(admit_only(w) for w in range(concurrency)))
        admit_elapsed = time.perf_counter() - t0
        assert all(r.kind is AdmissionKind.ADMIT for r in held)
        for r in held:
            await c.release(r)
        # the store's own counters, not the replica's cached view of them (a heartbeat's
        # usage read racing the last releases may leave that cache stale until the next)
        assert sum((await c.store.usage()).values()) == 0
        return {
            "store": url.split("://")[0],
            "p50_ms": statistics.median(latencies) * 1000,
            "p99_ms": pct(latencies, 0.99) * 1000,
            "sequential_decisions_per_s": len(latencies) / sum(latencies),
            "concurrent_decisions_per_s": per_task * concurrency / elapsed,
            "concurrent_admits_only_per_s": per_task * concurrency / admit_elapsed,
            "concurrency": concurrency,
        }
    finally:
        await c.stop()
        await store.close()


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = [await run_store("memory://", args.decisions, args.concurrency)]
    with redis_server() as url:
        rows.append(await run_store(url, args.decisions, args.concurrency))
    base = rows[0]
    for row in rows[1:]:
        row["p99_vs_memory"] = row["p99_ms"] / base["p99_ms"]
        row["throughput_vs_memory"] = (
            row["concurrent_decisions_per_s"] / base["concurrent_decisions_per_s"]
        )
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--decisions", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--json", action="store_true", help="print JSON rows only")
    parser.add_argument("--no-uvloop", action="store_true", help="plain asyncio event loop")
    parsed = parser.parse_args()
    if parsed.no_uvloop:
        results = asyncio.run(main(parsed))
    else:
        import uvloop  # the loop `kvgate serve` runs on

        results = uvloop.run(main(parsed))
    if parsed.json:
        print(json.dumps(results, indent=2))
    else:
        print(
            f"{'store':8} {'p50 ms':>8} {'p99 ms':>8} {'seq dec/s':>10} "
            f"{'conc admit+release/s':>21} {'conc admits/s':>14}"
        )
        for r in results:
            print(
                f"{r['store']:8} {r['p50_ms']:8.3f} {r['p99_ms']:8.3f} "
                f"{r['sequential_decisions_per_s']:10.0f} {r['concurrent_decisions_per_s']:21.0f} "
                f"{r['concurrent_admits_only_per_s']:14.0f}"
            )
        for r in results[1:]:
            print(
                f"{r['store']} vs memory: p99 x{r['p99_vs_memory']:.1f}, "
                f"throughput x{r['throughput_vs_memory']:.2f}"
            )
