"""Exact cache prediction against one real vLLM 0.32 CPU engine (``-m real_vllm``).

1. Render parity: for a deterministic corpus of 210 requests (system prompts, multi-turn,
   tools and tool calls, text parts, developer messages, completions), the token ids
   kvgate computes (``PromptHasher.engine_tokens``: the model's chat template, vLLM's rules)
   equal the ids vLLM's own ``/v1/chat/completions/render`` and ``/v1/completions/render``
   return (enabled by ``--enable-scale-out``), on every request.
2. Prediction parity: behind ``kvgate serve`` with ``policy: precise`` and the engine's KV
   events, ``X-KVGate-Expected-Cached-Tokens`` equals vLLM's
   ``usage.prompt_tokens_details.cached_tokens`` on warm chat and completion requests,
   streamed and not, and on conversations continued with the engine's own replies. The hashing block size (32) is not configured: the gateway reads it
   from the engine's ``cache_config_info``.

The engine publishes its events on an ipc socket in a private directory (vLLM binds ipc
endpoints; a tcp one it binds only as ``tcp://*``).
"""

from __future__ import annotations

import json
import random
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvgate.kv_events.tokenizer import PromptHasher
from kvgate.procs import GatewayProcess, start_gateway_process, wait_until_routable
from kvgate.procs.vllm import MODEL_NAME, VllmServer, missing_reason, start_vllm_servers
from tests.kv_events.render_corpus import (
    chat_body,
    completion_body,
    corpus,
    system_prompts,
    words,
)

# alone: the index learns what vLLM cached from its KV events, which lag behind the engine
# when the machine is starved; beside the parallel suite on 2 cores, 2 of 68 warm requests
# were predicted one block short (the previous turn's blocks not yet indexed)
pytestmark = [pytest.mark.real_vllm, pytest.mark.alone, pytest.mark.timeout(900)]
ADMIN_TOKEN = "parity-admin"


def post(url: str, body: dict[str, Any]) -> tuple[dict[str, str], Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return dict(response.headers), json.load(response)
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"{url}: HTTP {exc.code}: {exc.read()[:500]!r}") from None


def post_stream(url: str, body: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    """A streamed request: (response headers, the usage of its last usage chunk)."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    usage: dict[str, Any] | None = None
    with urllib.request.urlopen(request, timeout=120) as response:
        headers = dict(response.headers)
        for line in response:
            if line.startswith(b"data: {"):
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
    assert usage is not None, "no usage chunk in the stream"
    return headers, usage


def cached(usage: dict[str, Any]) -> int:
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


@pytest.fixture(scope="module")
def events_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="kvgate-vllm-ev-") as d:
        yield Path(d)


@pytest.fixture(scope="module")
def engine(events_dir: Path) -> Iterator[VllmServer]:
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"ipc://{events_dir}/events",
        "replay_endpoint": f"ipc://{events_dir}/replay",
        "topic": "",
    }
    (server,) = start_vllm_servers(
        1,
        extra_args=["--enable-scale-out", "--kv-events-config", json.dumps(events)],
        ready_timeout=360.0,
    )
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def hasher(engine: VllmServer) -> PromptHasher:
    return PromptHasher(engine.model_dir / "tokenizer.json")


def test_token_ids_equal_vllm_render_on_the_whole_corpus(
    engine: VllmServer, hasher: PromptHasher
) -> None:
    assert hasher.renderer.template is not None  # the model's own template, not kvgate's
    requests = corpus()
    assert len(requests) >= 200
    assert {e for e, _ in requests} == {"chat", "completions"}
    mismatches = []
    for i, (endpoint, body) in enumerate(requests):
        if endpoint == "chat":
            _, out = post(engine.url + "/v1/chat/completions/render", body)
            theirs = out["token_ids"]
        else:
            _, out = post(engine.url + "/v1/completions/render", body)
            theirs = out[0]["token_ids"]
        ours = hasher.engine_tokens(endpoint, body)
        if ours != theirs:
            mismatches.append((i, endpoint, len(ours), len(theirs)))
    assert mismatches == [], f"{len(mismatches)} of {len(requests)} differ: {mismatches[:10]}"


@pytest.fixture(scope="module")
def gateway(engine: VllmServer, events_dir: Path) -> Iterator[GatewayProcess]:
    config = {
        "nodes": [
            {
                "id": "v0",
                "url": engine.url,
                "model": MODEL_NAME,
                "engine_type": "vllm",
                "kv_events": {
                    "endpoint": f"ipc://{events_dir}/events",
                    "replay_endpoint": f"ipc://{events_dir}/replay",
                },
            }
        ],
        "routing": {"policy": "precise", "scrape_interval_s": 0.5},
        "auth": {"admin_token": ADMIN_TOKEN},
        # no block_size: the engine's (32, from cache_config_info) is used
        "kv_events": {
            "tokenizers": {MODEL_NAME: str(engine.model_dir / "tokenizer.json")},
            "hash_seed": "0",
        },
    }
    gw = start_gateway_process(config=config)
    try:
        wait_until_routable(gw, timeout=30)
        yield gw
    finally:
        gw.stop()


def _metric(gw: GatewayProcess, name: str, labels: str = "") -> float | None:
    with urllib.request.urlopen(gw.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith(f"{name}{labels} ") or line.startswith(f"{name}{{{labels}}} "):
            return float(line.rsplit(" ", 1)[1])
    return None


def _wait_block_size(gw: GatewayProcess) -> None:
    for _ in range(100):
        if _metric(gw, "kvgate_kv_events_block_size", 'node="v0"') == 32.0:
            return
        time.sleep(0.1)
    raise AssertionError("the gateway never learned the engine's block size")


def test_expected_cached_tokens_equal_vllm_cached_tokens(gateway: GatewayProcess) -> None:
    _wait_block_size(gateway)
    rng = random.Random(23)
    # long shared prefixes (~700 tokens), distinct from the render corpus's
    systems = [s + " " + words(rng, 400) for s in system_prompts(4, 120, seed=23)]
    rows: list[tuple[str, bool, int, int]] = []
    for i in range(56):
        chat = i % 2 == 0
        body = chat_body(5000 + i, systems) if chat else completion_body(5000 + i, systems)
        path = "/v1/chat/completions" if chat else "/v1/completions"
        stream = i % 3 == 0
        if stream:
            body = {**body, "stream": True, "stream_options": {"include_usage": True}}
            headers, usage = post_stream(gateway.url + path, body)
        else:
            headers, out = post(gateway.url + path, body)
            usage = out["usage"]
        expected = int(headers["X-KVGate-Expected-Cached-Tokens"])
        rows.append(("chat" if chat else "completions", stream, expected, cached(usage)))
    # conversations that continue with the engine's own replies: its cache holds the
    # generated tokens, the next turn re-tokenizes their text
    for c in range(4):
        messages: list[dict[str, Any]] = [{"role": "system", "content": systems[c]}]
        for _turn in range(3):
            messages.append({"role": "user", "content": words(rng, 12)})
            body = {"model": MODEL_NAME, "messages": messages, "max_tokens": 24}
            headers, out = post(gateway.url + "/v1/chat/completions", body)
            expected = int(headers["X-KVGate-Expected-Cached-Tokens"])
            rows.append(("chat", False, expected, cached(out["usage"])))
            messages.append(
                {"role": "assistant", "content": out["choices"][0]["message"]["content"]}
            )
    warm = [r for r in rows if r[3] > 0]
    assert len(warm) >= 40, rows
    assert {r[0] for r in warm} == {"chat", "completions"} and {r[1] for r in warm} == {
        True,
        False,
    }
    equal = [r for r in rows if r[2] == r[3]]
    assert len(equal) >= 0.99 * len(rows), [r for r in rows if r[2] != r[3]]
    assert _metric(gateway, "kvgate_kv_events_decisions_total", 'state="precise"') == len(rows)
    assert _metric(gateway, "kvgate_kv_events_unrendered_total") == 0.0
    # the hit-feedback totals count in the engine's tokens: predicted and actual rates agree
    total_actual = sum(r[3] for r in rows)
    node: dict[str, Any] = {}
    for _ in range(100):
        request = urllib.request.Request(
            gateway.url + "/admin/summary", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            (node,) = json.load(response)["nodes"]
        if node["actual_cached_tokens"] >= total_actual:
            break
        time.sleep(0.1)
    assert node["actual_cached_tokens"] == total_actual, node
    assert node["expected_cached_tokens"] == sum(r[2] for r in rows), node
    assert 0.5 < node["actual_hit_rate"] <= 1.0, node
    assert node["predicted_hit_rate"] == pytest.approx(node["actual_hit_rate"], abs=0.01), node
