"""The deploy/kubernetes topology on one machine, with the manifests' own config: a real
Envoy asks ``kvgate epp`` (the rendered ConfigMap + Secret) for every request; the engines
are found only through the model-server sidecars (the Deployment's sidecar arguments)
reporting to a real Redis, as in the cluster. Pod names and IPs become loopback ones."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from email.message import Message
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvgate.procs.servers import start_engine_process
from tests.deploy.manifests import Manifest, load_manifests, render_epp_config

pytest.importorskip("kvgate.epp", reason="kvgate epp is not in this tree yet")
envoy_procs = pytest.importorskip("kvgate.procs.envoy")
if envoy_procs.missing_reason() is not None:
    pytest.skip(envoy_procs.missing_reason(), allow_module_level=True)

POD_NAME = "kvgate-epp-5f7c9d8b4-q8w2n"


def _sidecar_args(manifests: list[Manifest], i: int, engine_url: str, store: str) -> list[str]:
    """The vLLM Deployment's sidecar arguments for pod ``i``, its engine at ``engine_url``."""
    spec = next(m for m in manifests if m.name == "vllm-qwen").doc["spec"]["template"]["spec"]
    (sidecar,) = [c for c in spec["containers"] if c["name"] == "kvgate-sidecar"]
    host_port = engine_url.split("//", 1)[1]
    args = []
    for arg in sidecar["args"]:
        arg = arg.replace("$(POD_NAME)", f"vllm-qwen-pod-{i}")
        arg = arg.replace("$(POD_IP):8000", host_port).replace("127.0.0.1:8000", host_port)
        arg = arg.replace("redis://kvgate-redis:6379", store).replace("0.0.0.0", "127.0.0.1")
        args.append(arg)
    # no metrics port (two sidecars share this host); a short drain for a quick teardown
    at = args.index("--metrics-port")
    del args[at : at + 2]
    args[args.index("--drain-timeout") + 1] = "1"
    return args


def _post(url: str, key: str | None, body: dict[str, Any]) -> tuple[int, Message, bytes]:
    """(status, headers (names case-insensitive: Envoy lowercases them), body)."""
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def _get(url: str, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10):
            return 200
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture(scope="module")
def manifests() -> list[Manifest]:
    return load_manifests()


@pytest.fixture
def cluster(
    manifests: list[Manifest], fresh_redis_server: Any, tmp_path: Path
) -> Iterator[dict[str, Any]]:
    out = tmp_path / "etc" / "config.yaml"
    out.parent.mkdir()
    rendered = render_epp_config(manifests, out, POD_NAME)
    assert rendered.returncode == 0, rendered.stderr
    config = yaml.safe_load(out.read_text())
    config["store"] = fresh_redis_server.url
    config["server"]["host"] = "127.0.0.1"  # the pod listens on 0.0.0.0
    engines = start_engine_process(count=2)
    sidecars: list[subprocess.Popen[bytes]] = []
    epp = envoy = None
    try:
        for i, url in enumerate(engines.urls):
            args = _sidecar_args(manifests, i, url, fresh_redis_server.url)
            log = (tmp_path / f"sidecar-{i}.log").open("wb")
            cmd = [sys.executable, "-m", "kvgate", *args]
            sidecars.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
        epp = envoy_procs.start_epp_process(config=config)
        deadline = time.monotonic() + 30
        nodes = 0
        while time.monotonic() < deadline and nodes < 2:
            with urllib.request.urlopen(epp.http_url + "/health", timeout=5) as resp:
                nodes = json.load(resp)["nodes"]
            time.sleep(0.2)
        assert nodes == 2, "the sidecars' nodes did not reach the picker through Redis"
        endpoints = [u.split("//", 1)[1] for u in engines.urls]
        envoy = envoy_procs.start_envoy(picker_port=epp.grpc_port, subset=endpoints)
        with urllib.request.urlopen(engines.urls[0] + "/v1/models", timeout=5) as resp:
            model = json.load(resp)["data"][0]["id"]
        yield {"envoy": envoy, "epp": epp, "model": model}
    finally:
        for handle in (envoy, epp):
            if handle is not None:
                handle.stop()
        for proc in sidecars:
            proc.terminate()
        for proc in sidecars:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        engines.stop()


def test_the_manifests_serve_through_envoy_and_fail_closed(
    manifests: list[Manifest], cluster: dict[str, Any]
) -> None:
    secret = next(m for m in manifests if m.kind == "Secret").doc["stringData"]
    url = cluster["envoy"].url + "/v1/chat/completions"
    body = {
        "model": cluster["model"],
        "messages": [{"role": "user", "content": "hello " * 40}],
        "max_tokens": 4,
    }
    for key in ("chat-app-api-key", "batch-jobs-api-key"):
        status, headers, payload = _post(url, secret[key], body)
        assert status == 200, payload
        assert headers.get("X-KVGate-Node") in ("vllm-qwen-pod-0", "vllm-qwen-pod-1")
        assert json.loads(payload)["choices"]
    status, _, payload = _post(url, None, body)
    assert status == 401
    assert json.loads(payload)["error"]["code"] == "invalid_api_key"
    admin = cluster["epp"].http_url + "/admin/summary"
    assert _get(admin, secret["admin-token"]) == 200
    assert _get(admin) == 401
    # FailClose / failure_mode_allow: false — no picker, no request
    cluster["epp"].stop()
    status, _, _ = _post(url, secret["chat-app-api-key"], body)
    assert 500 <= status < 600
