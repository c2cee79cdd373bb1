"""The decision owner's side of ``kvgate serve --workers N``: sockets and worker processes.

The owner binds the public port without listening (reserving it, and resolving port 0),
serves its full app and the decision IPC on Unix sockets in a private directory, and
starts N ``kvgate.gateway.worker`` processes that listen on the same port with
SO_REUSEPORT, so the kernel spreads connections across them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from kvgate.gateway.decisions import DecisionOwner, merge_gateway_metrics
from kvgate.gateway.errors import UNEXPECTED_ERRORS
from kvgate.gateway.gateway import GATEWAY
from kvgate.gateway.worker import reuseport_socket


class WorkerSet:
    """Owner app + decision IPC + N worker processes on one public port."""

    def __init__(
        self,
        app: web.Application,
        config_data: dict[str, Any],
        *,
        workers: int,
        host: str,
        port: int,
        log_level: str = "info",
        reserved: socket.socket | None = None,
    ) -> None:
        """``reserved``: the public port's socket, already bound with SO_REUSEPORT (else
        bound in ``start``)."""
        self.app = app
        self.config_data = config_data
        self.workers = workers
        self.host = host
        self.port = port
        self.log_level = log_level
        self.procs: list[subprocess.Popen[bytes]] = []
        self._tmp = tempfile.TemporaryDirectory(prefix="kvgate-owner-")
        self._runner: web.AppRunner | None = None
        self._ipc: asyncio.AbstractServer | None = None
        self._reserved: socket.socket | None = reserved
        gateway = app[GATEWAY]
        self.owner = DecisionOwner(gateway)
        unexpected = app.get(UNEXPECTED_ERRORS)
        merge_gateway_metrics(
            gateway.registry,
            gateway.metrics,
            self.owner.worker_metrics,
            *([unexpected] if unexpected is not None else []),
        )

    async def start(self, ready_timeout: float = 30.0) -> int:
        root = Path(self._tmp.name)
        http_path, ipc_path = str(root / "owner.http"), str(root / "owner.ipc")
        self._runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=5.0)
        await self._runner.setup()
        await web.UnixSite(self._runner, http_path).start()
        self._ipc = await self.owner.serve(ipc_path)
        if self._reserved is None:
            self._reserved = reuseport_socket(self.host, self.port)  # bound, never listening
        port = int(self._reserved.getsockname()[1])
        data = {**self.config_data, "server": {**(self.config_data.get("server") or {})}}
        data["server"].update({"host": self.host, "port": port})
        for i in range(self.workers):
            ready = root / f"ready-{i}"
            cmd = [
                sys.executable, "-m", "kvgate.gateway.worker",
                "--config-json", json.dumps(data), "--port", str(port),
                "--owner-http", http_path, "--owner-ipc", ipc_path,
                "--log-level", self.log_level, "--ready-file", str(ready),
            ]  # fmt: skip
            self.procs.append(subprocess.Popen(cmd))
        deadline = time.monotonic() + ready_timeout
        while not all((root / f"ready-{i}").exists() for i in range(self.workers)):
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"a gateway worker exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError("gateway workers not ready in time")
            await asyncio.sleep(0.05)
        self.port = port
        return port

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    async def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            for _ in range(100):
                if proc.poll() is not None:
                    break
                await asyncio.sleep(0.05)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if self._ipc is not None:
            self._ipc.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._reserved is not None:
            self._reserved.close()
        with contextlib.suppress(OSError):
            self._tmp.cleanup()


def default_workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
