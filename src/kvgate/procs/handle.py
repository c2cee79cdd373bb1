"""What every started server process shares: its PID, its log, stop, kill, readiness."""

from __future__ import annotations

import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path


class ChildFailed(RuntimeError):
    """A child exited or never became ready; the message carries its log tail."""


class ProcessHandle:
    """Mixin for dataclasses with ``process``, ``log_path`` and ``_tmpdir`` fields."""

    process: subprocess.Popen[bytes]
    log_path: Path
    _tmpdir: tempfile.TemporaryDirectory[str] | None

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL (a crash): the process gets no chance to clean up."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM and wait; SIGKILL if it does not exit in time."""
        terminate(self.process, timeout)
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None


def terminate(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM and wait; SIGKILL if it does not exit in time (nothing if it has ended)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def discard(proc: subprocess.Popen[bytes], tmp: tempfile.TemporaryDirectory[str]) -> None:
    """Clean up after a child that failed to start: kill it, remove its temp folder."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)
    tmp.cleanup()


def healthy(url: str, timeout: float = 2.0) -> bool:
    """``GET url/health`` answers 200."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def log_tail(log_path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(log_path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_for_ports(
    proc: subprocess.Popen[bytes],
    port_file: Path,
    expected: int,
    log_path: Path,
    *,
    name: str,
    timeout: float = 30.0,
) -> list[int]:
    """The ports a child wrote to ``port_file`` (one per line), once each answers
    ``/health``; ``ChildFailed`` if it exits first or is not ready in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ChildFailed(f"{name} exited with {proc.returncode}:\n{log_tail(log_path)}")
        text = port_file.read_text() if port_file.exists() else ""
        ports = [int(p) for p in text.split()]
        if len(ports) >= expected and all(healthy(f"http://127.0.0.1:{p}") for p in ports):
            return ports
        time.sleep(0.05)
    raise ChildFailed(f"{name} not ready within {timeout:.0f} s:\n{log_tail(log_path)}")
