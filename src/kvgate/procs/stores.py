"""Real Redis and etcd servers on free loopback ports, stopped by PID (tests and
benchmarks start them; kvgate itself only connects to them)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from kvgate.procs.handle import terminate
from kvgate.procs.ports import free_port


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class Server:
    scheme = ""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def command(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        return _port_open(self.port)

    def start(self, timeout: float = 20.0) -> None:
        if self.process is not None and self.process.poll() is None:
            return
        log = open(self.workdir / f"{self.scheme}.log", "ab")  # noqa: SIM115 - kept by Popen
        self.process = subprocess.Popen(
            self.command(), cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.scheme} server exited: {self.log()}")
            if self.ready():
                return
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"{self.scheme} server not ready in {timeout}s: {self.log()}")

    def stop(self) -> None:
        if self.process is not None:
            terminate(self.process)

    def log(self) -> str:
        path = self.workdir / f"{self.scheme}.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""


class RedisServer(Server):
    scheme = "redis"

    def command(self) -> list[str]:
        return [
            shutil.which("redis-server") or "/usr/bin/redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.workdir),
        ]

    def ready(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False


class EtcdServer(Server):
    scheme = "etcd"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.peer_port = free_port()

    def command(self) -> list[str]:
        client = f"http://127.0.0.1:{self.port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [
            shutil.which("etcd") or "/usr/bin/etcd",
            "--name",
            "kvgate-test",
            "--data-dir",
            str(self.workdir / "etcd-data"),
            "--listen-client-urls",
            client,
            "--advertise-client-urls",
            client,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            f"kvgate-test={peer}",
            "--log-level",
            "error",
        ]

    def ready(self) -> bool:

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=0.5) as r:
                return b"true" in r.read()
        except OSError:
            return False
