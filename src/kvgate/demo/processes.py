"""Child processes of the demo: each in its own process group, stopped by PID.

Children get their own session, so a terminal Ctrl-C reaches only the demo; the demo
then stops each child itself (SIGTERM, then SIGKILL) and waits for it, leaving nothing
behind. ``atexit`` covers exits that skip the normal path.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path


class ChildFailed(RuntimeError):
    """A child exited or never became ready; the message carries its log tail."""


class ProcessGroup:
    """The demo's children; ``stop_all()`` is idempotent and safe from signal handlers."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.children: list[tuple[str, subprocess.Popen[bytes]]] = []
        atexit.register(self.stop_all)

    def start(self, name: str, args: Sequence[str]) -> subprocess.Popen[bytes]:
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "kvgate", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.children.append((name, proc))
        return proc

    def log_tail(self, name: str, lines: int = 20) -> str:
        try:
            text = (self.log_dir / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, proc: subprocess.Popen[bytes], timeout_s: float = 5.0) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=timeout_s)
        self.children = [(n, p) for n, p in self.children if p is not proc]

    def stop_all(self) -> None:
        for _, proc in reversed(list(self.children)):
            self.stop(proc)

    def pids(self) -> list[int]:
        return [p.pid for _, p in self.children]


def wait_for_port_file(
    group: ProcessGroup,
    name: str,
    proc: subprocess.Popen[bytes],
    port_file: Path,
    expected: int,
    timeout_s: float = 30.0,
) -> list[int]:
    """Ports the child wrote, once each answers ``/health``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ChildFailed(f"{name} exited with {proc.returncode}:\n{group.log_tail(name)}")
        text = port_file.read_text() if port_file.exists() else ""
        ports = [int(p) for p in text.split()]
        if len(ports) >= expected and all(_healthy(port) for port in ports):
            return ports
        time.sleep(0.05)
    raise ChildFailed(f"{name} not ready within {timeout_s:.0f} s:\n{group.log_tail(name)}")


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False
