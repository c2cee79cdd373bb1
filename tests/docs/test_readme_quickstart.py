"""The README's five-minute quickstart, run as written (only the ports are moved to free
ones and ``.venv/bin/`` points at this interpreter's scripts): step 3's curl shows
``HTTP 200`` and the ``X-KVGate-*`` headers for ``"model":"default"``."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvgate.procs.stores import free_port

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
README_PORTS = (8000, 8001, 8002, 8003, 8004)


def _quickstart_steps() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Five-minute quickstart", 1)[1]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    steps: list[str] = []
    current: list[str] = []
    for line in block.splitlines():
        if line.startswith("# "):
            if current:
                steps.append("\n".join(current))
            current = []
        elif line.strip():
            current.append(line)
    if current:
        steps.append("\n".join(current))
    return steps


def _localized(command: str, ports: dict[int, int]) -> str:
    command = command.replace(".venv/bin/", f"{BIN}/")
    return re.sub(
        r"(:|--port |--base-port )(800[0-4])\b",
        lambda m: f"{m.group(1)}{ports[int(m.group(2))]}",
        command,
    )


def _wait_health(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} not healthy within {timeout:.0f} s")


def _free_consecutive(n: int) -> int:
    """A base port with ``n`` free ports after it (engine-sim uses base+i)."""
    for _ in range(50):
        base = free_port()
        if base + n < 65535 and all(_port_free(base + i) for i in range(n)):
            return base
    raise AssertionError("no run of free ports")


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture()
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_readme_quickstart_shows_kvgate_headers(
    started: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    steps = _quickstart_steps()
    assert len(steps) >= 4, steps
    base = _free_consecutive(4)
    ports = {8000: free_port(), **{8001 + i: base + i for i in range(4)}}
    engines, gateway, request, status = (_localized(s, ports) for s in steps[:4])
    for step, name in ((engines, "engines"), (gateway, "gateway")):
        assert step.rstrip().endswith("&"), f"README step starts the {name} in the background"
        log = (tmp_path / f"{name}.log").open("wb")
        started.append(
            subprocess.Popen(
                ["bash", "-c", step.rstrip().removesuffix("&")],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        urls = [f"http://127.0.0.1:{ports[p]}" for p in README_PORTS[1:]]
        for url in urls if name == "engines" else [f"http://127.0.0.1:{ports[8000]}"]:
            _wait_health(url)
    time.sleep(1.0)  # the gateway's first scrape of the engines
    out = subprocess.run(["bash", "-c", request], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = [line.strip() for line in out.stdout.splitlines()]
    assert lines[0].startswith("HTTP/1.1 200"), out.stdout
    headers = {line.split(":", 1)[0].lower() for line in lines[1:]}
    for name in ("node", "route-reason", "expected-cached-tokens", "admission"):
        assert f"x-kvgate-{name}" in headers, out.stdout
    first = status.splitlines()[0]  # kvgate status
    shown = subprocess.run(["bash", "-c", first], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "node-3" in shown.stdout
