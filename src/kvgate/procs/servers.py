"""``kvgate engine-sim`` and ``kvgate serve`` as child processes on free loopback ports.

``start_engine_process(count=N, ...)`` starts one process hosting N engines and returns an
``EngineProcess`` (``.urls``, ``.ports``, ``.pid``, ``.stop()``, ``.kill()``) once every
``/health`` answers. ``start_gateway_process(backends=[...], config={...})`` writes the
config to a temp YAML file, starts ``kvgate serve --port 0`` and returns a
``GatewayProcess`` (``.url``) once ``/health`` answers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kvgate.procs.handle import ProcessHandle, discard, wait_for_ports

DEFAULT_TIME_SCALE = 50.0


@dataclass
class EngineProcess(ProcessHandle):
    urls: list[str]
    ports: list[int]
    process: subprocess.Popen[bytes]
    log_path: Path
    _tmpdir: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return self.urls[0]


@dataclass
class GatewayProcess(ProcessHandle):
    url: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    config_path: Path | None = None
    _tmpdir: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)


def _start(
    args: list[str],
    tmp: tempfile.TemporaryDirectory[str],
    log_path: Path,
    port_file: Path,
    expected: int,
    *,
    name: str,
    timeout: float,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], list[int]]:
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    try:
        return proc, wait_for_ports(proc, port_file, expected, log_path, name=name, timeout=timeout)
    except BaseException:
        discard(proc, tmp)
        raise


def start_engine_process(
    *,
    count: int = 1,
    profile: str = "gemma3-270m-cpu",
    time_scale: float = DEFAULT_TIME_SCALE,
    kv_blocks: int | None = None,
    model: str | None = None,
    extra_args: Sequence[str] = (),
    timeout: float = 30.0,
) -> EngineProcess:
    tmp = tempfile.TemporaryDirectory(prefix="kvgate-engine-")
    port_file = Path(tmp.name) / "ports"
    log_path = Path(tmp.name) / "engine.log"
    cmd = [
        sys.executable, "-m", "kvgate", "engine-sim",
        "--count", str(count), "--base-port", "0", "--port-file", str(port_file),
        "--profile", profile, "--time-scale", str(time_scale),
    ]  # fmt: skip
    if kv_blocks is not None:
        cmd += ["--kv-blocks", str(kv_blocks)]
    if model is not None:
        cmd += ["--model", model]
    cmd += list(extra_args)
    proc, ports = _start(
        cmd, tmp, log_path, port_file, count, name="kvgate engine-sim", timeout=timeout
    )
    return EngineProcess([f"http://127.0.0.1:{p}" for p in ports], ports, proc, log_path, tmp)


def start_gateway_process(
    *,
    backends: Sequence[str] | None = None,
    config: dict[str, Any] | None = None,
    extra_args: Sequence[str] = (),
    python_args: Sequence[str] = (),
    ready_timeout: float = 30.0,
    env: dict[str, str] | None = None,
) -> GatewayProcess:
    """Start ``kvgate serve`` on a free loopback port and wait until /health answers.

    ``python_args`` go between the interpreter and ``-m kvgate`` (e.g. a profiler).
    """
    tmp = tempfile.TemporaryDirectory(prefix="kvgate-gw-")
    root = Path(tmp.name)
    port_file, log_path = root / "port", root / "gateway.log"
    args = [sys.executable, *python_args, "-m", "kvgate", "serve"]
    args += ["--port", "0", "--port-file", str(port_file)]
    config_path = None
    if config is not None:
        config_path = root / "gateway.yaml"
        config_path.write_text(yaml.safe_dump(config))
        args += ["--config", str(config_path)]
    if config is None or "host" not in (config.get("server") or {}):
        args += ["--host", "127.0.0.1"]
    for url in backends or ():
        args += ["--backend", url]
    args += list(extra_args)
    proc, (port,) = _start(
        args, tmp, log_path, port_file, 1, name="kvgate serve", timeout=ready_timeout, env=env
    )
    return GatewayProcess(
        url=f"http://127.0.0.1:{port}",
        port=port,
        process=proc,
        log_path=log_path,
        config_path=config_path,
        _tmpdir=tmp,
    )


def wait_until_routable(gw: GatewayProcess, timeout: float = 20.0) -> None:
    """Until the gateway lists a model (its nodes answered discovery)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{gw.url}/v1/models", timeout=2) as r:
                if r.status == 200 and b'"id"' in r.read():
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"gateway never listed a model:\n{gw.log()}")
