"""Fixtures for sidecar tests: ``sidecars(...)`` starts ``kvgate sidecar`` processes."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


class SidecarProcess:
    def __init__(self, args: list[str]) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="kvgate-sidecar-")
        self.log_path = Path(self._tmp.name) / "sidecar.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "kvgate", "sidecar", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self._tmp.cleanup()


@pytest.fixture
def sidecars() -> Iterator[Callable[..., SidecarProcess]]:
    started: list[SidecarProcess] = []

    def start(
        engine_url: str, store_url: str, node_id: str, *extra: str, interval: float = 0.3
    ) -> SidecarProcess:
        p = SidecarProcess(
            [
                "--engine", engine_url, "--engine-type", "sim", "--node-id", node_id,
                "--store", store_url, "--interval", str(interval), "--window", "1",
                "--log-level", "info", *extra,
            ]
        )  # fmt: skip
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()
