"""Faults under load, measured from outside: what clients see, how long a dead node keeps
getting work, and how long recovery takes.

Each scenario starts its own processes (4 ``kvgate engine-sim`` processes, one engine
each so one can be killed or frozen; ``kvgate serve`` in front; ``redis-server`` where
the scenario needs it), runs an open-loop load (half the requests streamed), injects one
fault, and measures only what the gateway exposes to anyone: HTTP answers and SSE
bodies, ``/metrics`` (``kvgate_dispatches_total`` by node, polled at 10 Hz) and
``/admin/summary``. Nothing here knows how the gateway handles a fault, so the same
script measures it before and after the failure handling changes.

Scenarios (``--scenarios`` picks some):

* ``kill1``   SIGKILL 1 of 4 engines; restarted on the same port after ``--down-s``.
* ``kill3``   SIGKILL 3 of 4 engines; restarted after ``--down-s``.
* ``stop1``   SIGSTOP 1 engine for ``--stop-s`` (default 20 s), then SIGCONT.
* ``abort``   50 non-streamed and 50 streamed clients that leave mid-request, and 20
  that leave while queued (the quota is made small so they queue).
* ``redis``   the gateway on ``redis://``; Redis restarted (empty) under load.

Columns: ``errors`` client-visible failures (status >= 500, connection errors, streams
ending with an SSE error or without ``[DONE]``), non-streamed / streamed, among requests
sent after the fault; ``late errors`` the same among requests sent >= 1 s after it;
``dead chosen`` how long after the fault the gateway still dispatched to the faulty
node(s) (and how many dispatches); ``max wait`` the longest request during the fault;
``recovery`` the time from restart / SIGCONT / Redis start until the node serves a
request again (or, for ``abort``, until engines and the quota ledger are back to
baseline; for ``redis``, until the gateway reports the store up); ``back in rotation``
the time from a faulty node answering ``/health`` again (restart) or SIGCONT until
``/admin/summary`` shows it routable and not ejected. The load: 8 system prompts (8 route
keys) plus, with ``--new-session-every n`` (default 4), every n-th request a new session
(a prefix nobody holds), so an empty restarted node has work it can win.

    .venv/bin/python bench/faults.py                      # all scenarios, ~3 minutes
    .venv/bin/python bench/faults.py --scenarios kill1,stop1 --down-s 5 --stop-s 10 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from kvgate.procs.handle import terminate
from kvgate.procs.ports import free_port
from kvgate.tasks import cancel_and_wait

ENGINES = 4
LEAVE_QUEUED_S = 0.3  # the abandoned-queued clients leave this long after sending
PYTHON = sys.executable


# -- processes ----------------------------------------------------------------------
def _get(url: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return bytes(resp.read())


def _wait(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            if check():
                return
        time.sleep(0.05)
    raise RuntimeError(f"{what} not ready in {timeout}s")


@dataclass
class Proc:
    args: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT)

    def signal(self, sig: int) -> None:
        if self.popen is not None and self.popen.poll() is None:
            os.kill(self.popen.pid, sig)

    def stop(self) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        self.signal(signal.SIGCONT)
        terminate(self.popen)

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(timeout=10)


class Cluster:
    """4 engines, optionally Redis, and one gateway, in a temp dir; stopped by PID."""

    def __init__(self, time_scale: float, gateway_extra: dict[str, Any], redis: bool) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="kvgate-faults-"))
        self.time_scale = time_scale
        self.ports = [free_port() for _ in range(ENGINES)]
        self.engines = [self._engine(i) for i in range(ENGINES)]
        self.redis: Proc | None = None
        self.redis_port = free_port()
        if redis:
            exe = shutil.which("redis-server") or "/usr/bin/redis-server"
            self.redis = Proc(
                [exe, "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", str(self.tmp)],
                self.tmp / "redis.log",
            )  # fmt: skip
        config: dict[str, Any] = {
            "nodes": [
                {"id": f"e{i}", "url": f"http://127.0.0.1:{p}", "model": "sim"}
                for i, p in enumerate(self.ports)
            ],
            **gateway_extra,
        }
        if redis:
            config["store"] = f"redis://127.0.0.1:{self.redis_port}"
        (self.tmp / "gateway.yaml").write_text(yaml.safe_dump(config))
        self.gateway = Proc(
            [PYTHON, "-m", "kvgate", "serve", "--config", str(self.tmp / "gateway.yaml"),
             "--host", "127.0.0.1", "--port", "0", "--port-file", str(self.tmp / "gw.port")],
            self.tmp / "gateway.log",
        )  # fmt: skip
        self.url = ""

    def _engine(self, i: int) -> Proc:
        return Proc(
            [PYTHON, "-m", "kvgate", "engine-sim", "--port", str(self.ports[i]),
             "--time-scale", str(self.time_scale), "--model", "sim"],
            self.tmp / f"engine{i}.log",
        )  # fmt: skip

    def engine_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.ports[i]}"

    def start_engine(self, i: int) -> None:
        self.engines[i].start()
        _wait(lambda: _get(self.engine_url(i) + "/health") is not None, f"engine {i}")

    def start_redis(self) -> None:
        assert self.redis is not None
        self.redis.start()
        port = self.redis_port

        def pong() -> bool:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")

        _wait(pong, "redis")

    def __enter__(self) -> Cluster:
        if self.redis is not None:
            self.start_redis()
        for i in range(ENGINES):
            self.start_engine(i)
        self.gateway.start()
        port_file = self.tmp / "gw.port"
        _wait(lambda: bool(port_file.read_text().strip()), "gateway port", timeout=60)
        self.url = f"http://127.0.0.1:{port_file.read_text().strip()}"
        _wait(lambda: _get(self.url + "/health") is not None, "gateway")
        return self

    def __exit__(self, *exc: object) -> None:
        self.gateway.stop()
        for engine in self.engines:
            engine.stop()
        if self.redis is not None:
            self.redis.stop()
        if not os.environ.get("KVGATE_FAULTS_KEEP"):
            shutil.rmtree(self.tmp, ignore_errors=True)


# -- load -----------------------------------------------------------------------------
@dataclass
class Result:
    sent: float
    done: float
    stream: bool
    status: int | None
    node: str
    error: str = ""  # "" when the client got a complete, good answer


@dataclass
class Load:
    url: str
    rate: float
    max_tokens: int
    new_session_every: int = 0  # every n-th request opens a new session (0: never)
    results: list[Result] = field(default_factory=list)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def one(self, session: aiohttp.ClientSession, i: int, stream: bool, **kw: Any) -> None:
        # 8 system prompts: 8 route keys, so every node gets work; a new session brings a
        # prefix nobody holds yet (where a restarted, empty node can win)
        every = self.new_session_every
        system = f"session {i}" if every and i % every == 0 else f"number {i % 8}"
        body = {"model": "sim", "max_tokens": kw.get("max_tokens") or self.max_tokens, "stream": stream,
                "ignore_eos": True, "messages": [
                    {"role": "system", "content": f"You are assistant {system}."},
                    {"role": "user", "content": f"fault run {i}"}]}  # fmt: skip
        sent = time.monotonic()
        status: int | None = None
        node, error = "", ""
        try:
            async with session.post(
                self.url + "/v1/chat/completions", json=body, headers=kw.get("headers")
            ) as r:
                status, node = r.status, r.headers.get("X-KVGate-Node", "")
                text = (await r.read()).decode(errors="replace")
            if status >= 500:
                error = f"http_{status}"
            elif stream and status == 200:
                if '"error"' in text:
                    error = "sse_error"
                elif "[DONE]" not in text:
                    error = "sse_truncated"
        except (aiohttp.ClientError, TimeoutError) as exc:
            error = type(exc).__name__
        self.results.append(Result(sent, time.monotonic(), stream, status, node, error))

    async def run(self, session: aiohttp.ClientSession, duration: float) -> None:
        start, i = time.monotonic(), 0
        while time.monotonic() - start < duration:
            i += 1
            task = asyncio.create_task(self.one(session, i, stream=i % 2 == 0))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            await asyncio.sleep(1.0 / self.rate)
        await asyncio.gather(*self._tasks)


ROUTABLE = ("healthy", "re-register")


class Watch:
    """Polls /metrics at 10 Hz: dispatches per node and the store state; with an admin
    token also /admin/summary: which nodes are in rotation (routable state, not ejected)."""

    def __init__(self, url: str, admin_token: str | None = None) -> None:
        self.url = url
        self.admin = {"Authorization": f"Bearer {admin_token}"} if admin_token else None
        self.samples: list[tuple[float, dict[str, float], float | None]] = []
        self.rotation: list[tuple[float, frozenset[str]]] = []
        self._task: asyncio.Task[None] | None = None

    async def _poll_rotation(self, session: aiohttp.ClientSession) -> None:
        async with session.get(self.url + "/admin/summary", headers=self.admin) as r:
            rows = (await r.json())["nodes"]
        routable = frozenset(
            row["node_id"] for row in rows if row["state"] in ROUTABLE and not row["outlier"]
        )
        self.rotation.append((time.monotonic(), routable))

    def in_rotation_after(self, nodes: set[str], t0: float) -> float | None:
        """Seconds after t0 until every one of ``nodes`` was in rotation (None: never)."""
        for t, routable in self.rotation:
            if t >= t0 and nodes <= routable:
                return t - t0
        return None

    async def _loop(self, session: aiohttp.ClientSession) -> None:
        while True:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(self.url + "/metrics") as r:
                    text = await r.text()
                per_node: dict[str, float] = {}
                for node, value in re.findall(
                    r'^kvgate_dispatches_total\{node="([^"]+)"[^}]*\} ([0-9.e+]+)$', text, re.M
                ):
                    per_node[node] = per_node.get(node, 0.0) + float(value)
                found = re.search(r"^kvgate_store_up ([0-9.]+)$", text, re.M)
                store_up = float(found.group(1)) if found else None
                self.samples.append((time.monotonic(), per_node, store_up))
                if self.admin is not None:
                    await self._poll_rotation(session)
            await asyncio.sleep(0.1)

    def start(self, session: aiohttp.ClientSession) -> None:
        self._task = asyncio.create_task(self._loop(session))

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    def busiest(self, n: int) -> list[int]:
        """Indexes of the ``n`` nodes with the most dispatches in the last 2 s."""
        if not self.samples:
            return list(range(n))
        now, latest, _ = self.samples[-1]
        old = next((p for t, p, _ in self.samples if t >= now - 2.0), {})
        recent = {node: v - old.get(node, 0.0) for node, v in latest.items()}
        ranked = sorted(range(ENGINES), key=lambda i: -recent.get(f"e{i}", 0.0))
        return sorted(ranked[:n])

    def chosen_after(self, nodes: set[str], t0: float, until: float) -> tuple[float, int]:
        """(seconds after t0 of the last dispatch to ``nodes`` before ``until``, count)."""
        last, count, prev = 0.0, 0, None
        for t, per_node, _ in self.samples:
            total = sum(per_node.get(n, 0.0) for n in nodes)
            if prev is not None and t > t0 and t <= until and total > prev:
                last, count = t - t0, count + int(total - prev)
            prev = total
        return last, count


# -- scenarios ------------------------------------------------------------------------
@dataclass
class Row:
    fault: str
    requests: int
    errors_unary: int
    errors_stream: int
    late_unary: int
    late_stream: int
    dead_chosen_s: float | None
    dead_dispatches: int | None
    max_wait_s: float
    recovery_s: float | None
    note: str = ""
    rotation_s: float | None = None  # restart / SIGCONT → every faulty node in rotation


def _errors(results: list[Result], t0: float, late: float = 0.0) -> tuple[int, int]:
    after = [r for r in results if r.sent >= t0 + late and r.error]
    return sum(not r.stream for r in after), sum(r.stream for r in after)


def _rotation(watch: Watch, up_at: dict[str, float]) -> float | None:
    """The longest time from a node being up again until it was back in rotation."""
    times = [watch.in_rotation_after({node}, t) for node, t in up_at.items()]
    return None if None in times else max(t for t in times if t is not None)


def _served_after(results: list[Result], node: str, t0: float) -> float | None:
    times = [r.done - t0 for r in results if r.node == node and not r.error and r.sent >= t0]
    return min(times) if times else None


async def engine_fault(args: argparse.Namespace, name: str, n_victims: int, how: str) -> Row:
    extra = {"auth": {"admin_token": "bench"}}
    with Cluster(args.time_scale, extra, redis=False) as cluster:
        load = Load(cluster.url, args.rate, args.max_tokens, args.new_session_every)
        watch = Watch(cluster.url, admin_token="bench")
        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=120), connector=aiohttp.TCPConnector(limit=0)
        ) as session:
            watch.start(session)
            held = args.stop_s if how == "stop" else args.down_s
            runner = asyncio.create_task(load.run(session, args.warmup_s + held + args.after_s))
            await asyncio.sleep(args.warmup_s)
            victims = watch.busiest(n_victims)  # the nodes the router likes best now
            t0 = time.monotonic()
            for v in victims:
                cluster.engines[v].signal(signal.SIGKILL if how == "kill" else signal.SIGSTOP)
            await asyncio.sleep(held)
            t_back = time.monotonic()
            up_at: dict[str, float] = {}  # node → when it answered /health again (or SIGCONT)
            for v in victims:
                if how == "kill":
                    cluster.engines[v].popen.wait(timeout=10)  # type: ignore[union-attr]
                    await asyncio.to_thread(cluster.start_engine, v)
                else:
                    cluster.engines[v].signal(signal.SIGCONT)
                up_at[f"e{v}"] = time.monotonic()
            await runner
            await watch.stop()
        nodes = {f"e{v}" for v in victims}
        chosen, count = watch.chosen_after(nodes, t0, t_back)
        during = [r for r in load.results if t0 <= r.sent < t_back]
        recovered = [_served_after(load.results, n, t_back) for n in sorted(nodes)]
        _, back_dispatches = watch.chosen_after(nodes, t_back, float("inf"))
        eu, es = _errors(load.results, t0)
        lu, ls = _errors(load.results, t0, late=1.0)
        return Row(
            name,
            len([r for r in load.results if r.sent >= t0]),
            eu,
            es,
            lu,
            ls,
            chosen,
            count,
            max((r.done - r.sent for r in during), default=0.0),
            None if None in recovered else max(r for r in recovered if r is not None),
            f"{how} {','.join(sorted(nodes))} for {held:.0f} s; {back_dispatches} dispatches "
            f"to it in the {args.after_s:.0f} s after",
            _rotation(watch, up_at),
        )


async def abort_fault(args: argparse.Namespace) -> Row:
    # a small quota so the abandoned-queued clients really queue
    # room for the 100 running ones only: the 20 larger ones after them must queue
    extra = {
        "auth": {"admin_token": "bench"},
        "admission": {"total_quota": 100 * (args.abort_tokens + 32),
                      "queue": {"default_deadline_s": 30, "max_queue_tokens": 10**7}},
    }  # fmt: skip
    with Cluster(args.time_scale, extra, redis=False) as cluster:
        load = Load(cluster.url, args.rate, args.abort_tokens)
        admin = {"Authorization": "Bearer bench"}

        async def baseline(session: aiohttp.ClientSession) -> tuple[int, float]:
            running = 0
            for i in range(ENGINES):
                async with session.get(cluster.engine_url(i) + "/metrics") as r:
                    text = await r.text()
                found = re.search(r"^vllm:num_requests_running\{[^}]*\} ([0-9.]+)$", text, re.M)
                running += int(float(found.group(1))) if found else 0
            async with session.get(cluster.url + "/admin/summary", headers=admin) as r:
                used = float((await r.json())["admission"]["used"] or 0)
            return running, used

        async def abandon(
            session: aiohttp.ClientSession, i: int, stream: bool, after: float, tag: str, n: int = 0
        ) -> None:
            request = load.one(
                session, i, stream, headers={"X-Request-Id": f"{tag}-{i}"}, max_tokens=n
            )
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(request, after)

        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=120), connector=aiohttp.TCPConnector(limit=0)
        ) as session:
            t0 = time.monotonic()
            # fill the quota with long requests, then 20 that queue behind them and leave
            fill = [
                asyncio.create_task(abandon(session, i, False, 0.8, "abandoned-run"))
                for i in range(50)
            ]
            fill += [
                asyncio.create_task(abandon(session, 100 + i, True, 0.8, "abandoned-run"))
                for i in range(50)
            ]
            await asyncio.sleep(0.2)
            queued = [
                asyncio.create_task(
                    abandon(
                        session,
                        200 + i,
                        False,
                        LEAVE_QUEUED_S,
                        "abandoned-queued",
                        2 * args.abort_tokens,
                    )
                )
                for i in range(20)
            ]
            await asyncio.gather(*fill, *queued)
            t_left = time.monotonic()
            recovery = None
            deadline = t_left + 60
            while time.monotonic() < deadline:
                running, used = await baseline(session)
                if running == 0 and used == 0:
                    recovery = time.monotonic() - t_left
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # let the access log flush
            async with session.get(cluster.url + "/metrics") as r:
                metrics = await r.text()
        # where the gateway counts clients that left while queued (if it does)
        found = re.search(
            r'^kvgate_cancellations_total\{stage="queued"\} ([0-9.]+)$', metrics, re.M
        )
        dropped = (
            f"; gateway counted {float(found.group(1)):.0f} queued cancellations" if found else ""
        )
        # dispatched at all, and admitted only after the client had left (it leaves
        # LEAVE_QUEUED_S after sending; the admission header says how long it queued)
        dispatched = late = 0
        for line in (cluster.tmp / "gateway.log").read_text(errors="replace").splitlines():
            if "kvgate.gateway.access" in line and "abandoned-queued" in line:
                entry = json.loads(line[line.index("{") :])
                if entry.get("node"):
                    dispatched += 1
                    queued = re.search(r"queued_ms=([0-9.]+)", entry.get("admission") or "")
                    late += bool(queued and float(queued.group(1)) >= LEAVE_QUEUED_S * 1000)
        return Row(
            "aborted clients (50+50 running, 20 queued)",
            120,
            0,
            0,
            0,
            0,
            None,
            None,
            time.monotonic() - t0,
            recovery,
            f"{late} abandoned queued admitted after their client left "
            f"({dispatched} dispatched in all){dropped}",
        )


async def redis_fault(args: argparse.Namespace) -> Row:
    extra = {"admission": {"lease_ttl_s": 3.0}}
    with Cluster(args.time_scale, extra, redis=True) as cluster:
        load = Load(cluster.url, args.rate, args.max_tokens)
        watch = Watch(cluster.url)
        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=120), connector=aiohttp.TCPConnector(limit=0)
        ) as session:
            watch.start(session)
            runner = asyncio.create_task(load.run(session, args.warmup_s + 1.0 + args.after_s))
            await asyncio.sleep(args.warmup_s)
            t0 = time.monotonic()
            assert cluster.redis is not None
            cluster.redis.stop()
            await asyncio.sleep(1.0)
            await asyncio.to_thread(cluster.start_redis)
            t_back = time.monotonic()
            await runner
            await watch.stop()
        states = [(t, up) for t, _, up in watch.samples if up is not None]
        flips = sum(1 for (_, a), (_, b) in itertools.pairwise(states) if a != b)
        up_again = [t - t_back for t, up in states if t >= t_back and up == 1.0]
        stable = next(
            (t for t in up_again if all(u == 1.0 for tt, u in states if tt - t_back >= t)), None
        )
        eu, es = _errors(load.results, t0)
        lu, ls = _errors(load.results, t0, late=1.0)
        log = (cluster.tmp / "gateway.log").read_text(errors="replace")
        return Row(
            "Redis restart (empty)",
            len([r for r in load.results if r.sent >= t0]),
            eu,
            es,
            lu,
            ls,
            None,
            None,
            max((r.done - r.sent for r in load.results if r.sent >= t0), default=0.0),
            stable,
            f"store_up flips seen {flips}; admission log: {log.count('unreachable (')} down, "
            f"{log.count('reachable again')} up",
        )


SCENARIOS: dict[str, Callable[[argparse.Namespace], Awaitable[Row]]] = {
    "kill1": lambda a: engine_fault(a, "SIGKILL 1 of 4", 1, "kill"),
    "kill3": lambda a: engine_fault(a, "SIGKILL 3 of 4", 3, "kill"),
    "stop1": lambda a: engine_fault(a, "SIGSTOP 1 of 4", 1, "stop"),
    "abort": abort_fault,
    "redis": redis_fault,
}


def table(rows: list[Row]) -> str:
    def f(v: float | None, unit: str = "s") -> str:
        return "—" if v is None else f"{v:.2f} {unit}"

    out = [
        "| fault | requests after fault | errors (non-stream / stream) | errors, sent ≥ 1 s after | "
        "dead node chosen for (dispatches) | max wait | back in rotation | recovery | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        chosen = (
            "—" if r.dead_chosen_s is None else f"{r.dead_chosen_s:.2f} s ({r.dead_dispatches})"
        )
        out.append(
            f"| {r.fault} | {r.requests} | {r.errors_unary} / {r.errors_stream} "
            f"| {r.late_unary} / {r.late_stream} "
            f"| {chosen} | {f(r.max_wait_s)} | {f(r.rotation_s)} | {f(r.recovery_s)} "
            f"| {r.note} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--abort-tokens", type=int, default=400, help="tokens of aborted requests")
    parser.add_argument("--time-scale", type=float, default=20.0)
    parser.add_argument("--warmup-s", type=float, default=4.0)
    parser.add_argument("--after-s", type=float, default=8.0, help="load after the node is back")
    parser.add_argument("--down-s", type=float, default=15.0, help="killed engines stay down")
    parser.add_argument("--stop-s", type=float, default=20.0, help="SIGSTOP length (bounded)")
    parser.add_argument(
        "--new-session-every",
        type=int,
        default=4,
        help="every n-th request opens a new session (a new prefix); 0: only the 8 prompts",
    )
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    args.stop_s = min(args.stop_s, 30.0)
    rows = []
    for name in args.scenarios.split(","):
        row = asyncio.run(SCENARIOS[name](args))
        print(table([row]).splitlines()[-1], flush=True)
        rows.append(row)
    print()
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in rows], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
