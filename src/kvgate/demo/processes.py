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
from collections.abc import Sequence
from pathlib import Path


class ProcessGroup:
    """The demo's children; ``stop_all()`` is idempotent and safe from signal handlers."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.children: list[tuple[str, subprocess.Popen[bytes]]] = []
        atexit.register(self.stop_all)

    def start(self, name: str, args: Sequence[str]) -> subprocess.Popen[bytes]:
        with self.log_path(name).open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "kvgate", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.children.append((name, proc))
        return proc

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

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
