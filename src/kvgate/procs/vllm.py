"""Start real vLLM (CPU build) OpenAI servers on free loopback ports.

vLLM lives in its own virtualenv (``$KVGATE_CACHE/vllm-venv``, ~3.5 GB) with a tiny model
directory (``$KVGATE_CACHE/models/vllm-tiny-llama``), both made by scripts/install-vllm.sh.
The engines load random weights (``--load-format dummy``): the text is noise, but the
scheduler, the paged KV cache with prefix caching, ``/metrics`` and the chat template are
vLLM's own. Used by tests/real_vllm (vLLM is no dependency of kvgate).

Each server runs in its own session (process group): vLLM's API server starts an engine-core
child, and stop/kill signal the whole group so that no engine outlives its test.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvgate.procs.handle import ChildFailed, ProcessHandle, healthy, log_tail
from kvgate.procs.llama import cache_dir
from kvgate.procs.ports import free_port

MODEL_NAME = "tiny"  # --served-model-name
MODEL_DIR_NAME = "vllm-tiny-llama"
BLOCK_SIZE = 32  # CPU attention needs a multiple of 32
ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "PYTHONHASHSEED": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


def find_python() -> Path | None:
    """$KVGATE_VLLM_PYTHON, else the python of the venv scripts/install-vllm.sh made."""
    if os.environ.get("KVGATE_VLLM_PYTHON"):
        path = Path(os.environ["KVGATE_VLLM_PYTHON"])
        return path if path.is_file() else None
    venv = cache_dir() / "vllm-venv"
    python = venv / "bin" / "python"
    return python if (venv / ".kvgate-stamp").is_file() and python.is_file() else None


def find_model() -> Path | None:
    """$KVGATE_VLLM_MODEL, else the tiny model dir scripts/install-vllm.sh built."""
    if os.environ.get("KVGATE_VLLM_MODEL"):
        path = Path(os.environ["KVGATE_VLLM_MODEL"])
    else:
        path = cache_dir() / "models" / MODEL_DIR_NAME
    complete = (path / "config.json").is_file() and (path / "tokenizer.json").is_file()
    return path if complete else None


def missing_reason() -> str | None:
    """Why real-vLLM tests cannot run here, or None when they can."""
    if find_python() is None:
        venv = cache_dir() / "vllm-venv"
        return f"vLLM venv not installed in {venv} (run scripts/install-vllm.sh)"
    if find_model() is None:
        return "tiny vLLM model dir not built (run scripts/install-vllm.sh)"
    return None


@dataclass
class VllmServer(ProcessHandle):
    url: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    model_dir: Path
    model: str = MODEL_NAME
    _tmpdir: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    def kill(self) -> None:
        """SIGKILL the server and its engine core (a crash)."""
        _signal_group(self.process, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.wait(timeout=10)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the server (it stops its engine core), then SIGKILL what is left."""
        if self.process.poll() is None:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout)
        _signal_group(self.process, signal.SIGKILL)  # an engine core left behind
        if self.process.poll() is None:
            self.process.wait(timeout=10)
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)  # its own session: the group id is its pid


def server_args(
    python: Path, model_dir: Path, port: int, extra_args: Sequence[str] = ()
) -> list[str]:
    return [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--served-model-name", MODEL_NAME,
        "--load-format", "dummy",
        "--block-size", str(BLOCK_SIZE),
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--prefix-caching-hash-algo", "sha256_cbor",
        "--max-model-len", "4096",
        "--host", "127.0.0.1",
        "--port", str(port),
        *extra_args,
    ]  # fmt: skip


def spawn_vllm_server(
    *, extra_args: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> VllmServer:
    """Start one server (not yet waited for: see ``wait_ready``)."""
    python, model_dir = find_python(), find_model()
    if python is None or model_dir is None:
        raise RuntimeError(missing_reason() or "vLLM unavailable")
    tmp = tempfile.TemporaryDirectory(prefix="kvgate-vllm-")
    log_path = Path(tmp.name) / "vllm.log"
    port = free_port()
    child_env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    child_env.update(ENGINE_ENV)
    child_env.update(env or {})
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            server_args(python, model_dir, port, extra_args),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=child_env,
            cwd=tmp.name,
            start_new_session=True,
        )
    return VllmServer(f"http://127.0.0.1:{port}", port, proc, log_path, model_dir, _tmpdir=tmp)


def wait_ready(servers: Sequence[VllmServer], timeout: float = 300.0) -> None:
    """Until every server's /health answers 200; ``ChildFailed`` (with the log tail) if one
    exits or the time runs out."""
    deadline = time.monotonic() + timeout
    pending = list(servers)
    while pending:
        for server in list(pending):
            if server.process.poll() is not None:
                raise ChildFailed(
                    f"vLLM exited with {server.process.returncode}:\n{log_tail(server.log_path, 60)}"
                )
            if healthy(server.url):
                pending.remove(server)
        if not pending:
            return
        if time.monotonic() > deadline:
            raise ChildFailed(
                f"vLLM not ready within {timeout:.0f} s:\n{log_tail(pending[0].log_path, 60)}"
            )
        time.sleep(0.5)


def start_vllm_servers(
    count: int = 1,
    *,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    ready_timeout: float = 300.0,
) -> list[VllmServer]:
    """``count`` servers started together (start-up is 60–90 s each), once all are healthy."""
    servers: list[VllmServer] = []
    try:
        for _ in range(count):
            servers.append(spawn_vllm_server(extra_args=extra_args, env=env))
        wait_ready(servers, ready_timeout)
    except BaseException:
        for server in servers:
            server.stop(timeout=5)
        raise
    return servers
