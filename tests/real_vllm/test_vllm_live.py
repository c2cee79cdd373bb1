"""kvgate against one real vLLM 0.32 CPU engine (``-m real_vllm``).

The vLLM adapter on a live ``/metrics``: capacity from ``cache_config_info``, KV usage,
running / waiting and the prefix-cache counters, checked against what the engine itself
reports per request (``usage.prompt_tokens_details.cached_tokens``). Then ``kvgate serve`` in
front of it: a chat completion, a streamed completion, and hit rates that are rates.

Each test uses its own prompts, so the engine's prefix cache (shared by the module) only
holds what that test sent.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from kvgate.adapters import get_adapter
from kvgate.adapters.prom import parse_metrics
from kvgate.procs import GatewayProcess, start_gateway_process, wait_until_routable
from kvgate.procs.vllm import BLOCK_SIZE, MODEL_NAME, VllmServer
from kvgate.types import NodeReport

pytestmark = [pytest.mark.real_vllm, pytest.mark.timeout(600)]

WORDS_TEXT = (
    "the cache prefix block engine model prompt reply route node gateway server "
    "latency queue memory batch decode prefill stream chat tool answer question "
    "document summary"
)
WORDS = tuple(WORDS_TEXT.split())
ADMIN_TOKEN = "real-vllm-admin"


def text(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.status == 200
        return json.load(response)


def get(url: str, headers: dict[str, str] | None = None) -> bytes:
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
        return bytes(response.read())


def complete(url: str, prompt: str, max_tokens: int = 4) -> dict[str, Any]:
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens}
    usage: dict[str, Any] = post(url + "/v1/completions", body)["usage"]
    return usage


def cached(usage: dict[str, Any]) -> int:
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


async def scrape(engine: VllmServer, previous: NodeReport | None = None) -> NodeReport:
    async with aiohttp.ClientSession() as session:
        return await get_adapter("vllm").scrape(
            session, engine.url, node_id="v0", now=time.time(), previous=previous, timeout_s=10
        )


async def test_scrape_reads_capacity_usage_and_prefix_counters(vllm_engine: VllmServer) -> None:
    metrics = parse_metrics(get(vllm_engine.url + "/metrics").decode())
    (info,) = metrics.get("vllm:cache_config_info")
    assert info.labels["block_size"] == str(BLOCK_SIZE)
    blocks = int(info.labels["num_gpu_blocks"])

    first = await scrape(vllm_engine)
    assert not first.stale and first.engine_type == "vllm"
    assert first.kv_capacity_tokens == blocks * BLOCK_SIZE
    assert first.extra["kv_block_size"] == BLOCK_SIZE
    assert 0.0 <= first.kv_usage <= 1.0
    assert first.process_start_time is not None and first.process_start_time < time.time()

    prompt = text(seed=1, words=400)  # ~400 tokens: 12 full blocks of 32
    usages = [complete(vllm_engine.url, prompt) for _ in range(4)]
    assert cached(usages[0]) == 0
    # Whole blocks are reused, short of the last prompt token (always recomputed).
    warm = (usages[0]["prompt_tokens"] - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert [cached(u) for u in usages[1:]] == [warm] * 3, usages

    second = await scrape(vllm_engine, previous=first)
    assert not second.stale and not second.counters_reset
    queries = second.extra["prefix_queries_total"] - first.extra["prefix_queries_total"]
    hits = second.extra["prefix_hits_total"] - first.extra["prefix_hits_total"]
    # The counters the adapter reads are the engine's own per-request figures, summed.
    assert queries == sum(u["prompt_tokens"] for u in usages)
    assert hits == sum(cached(u) for u in usages)
    assert second.prefix_hit_rate == pytest.approx(hits / queries)
    assert 0.5 < second.prefix_hit_rate <= 1.0
    prompt_tokens = second.extra["prompt_tokens_total"] - first.extra["prompt_tokens_total"]
    assert prompt_tokens == queries and second.prompt_tokens_rate > 0
    assert second.generation_tokens_rate > 0
    assert (second.running, second.waiting) == (0.0, 0.0)
    assert 0.0 <= second.kv_usage <= 1.0


@pytest.fixture
def long_stream(vllm_engine: VllmServer) -> Iterator[threading.Event]:
    """A streamed completion of 2,000 tokens running in the background; the event is set
    at its first chunk. The connection is closed (vLLM aborts the request) at teardown."""
    started, done = threading.Event(), threading.Event()
    body = {
        "model": MODEL_NAME,
        "prompt": text(seed=2, words=200),
        "max_tokens": 2000,
        "ignore_eos": True,
        "stream": True,
    }

    def run() -> None:
        request = urllib.request.Request(
            vllm_engine.url + "/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            for line in response:
                if line.startswith(b"data: "):
                    started.set()
                if done.is_set():
                    return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield started
    done.set()
    thread.join(timeout=60)


async def test_scrape_sees_a_running_request(
    vllm_engine: VllmServer, long_stream: threading.Event
) -> None:
    assert long_stream.wait(timeout=60)
    report = await scrape(vllm_engine)
    assert not report.stale
    assert report.running == 1.0 and report.waiting == 0.0
    # ~200 prompt tokens + what it generated so far, of 524,288: a small fraction, not zero.
    assert 0.0 < report.kv_usage <= 0.01


@pytest.fixture(scope="module")
def gateway(vllm_engine: VllmServer) -> Iterator[GatewayProcess]:
    gw = start_gateway_process(
        backends=[vllm_engine.url],
        config={"auth": {"admin_token": ADMIN_TOKEN}},
        extra_args=["--engine-type", "vllm", "--scrape-interval", "0.5"],
    )
    try:
        wait_until_routable(gw, timeout=30)
        yield gw
    finally:
        gw.stop()


def summary(gw: GatewayProcess) -> dict[str, Any]:
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    body: dict[str, Any] = json.loads(get(gw.url + "/admin/summary", auth))
    return body


def test_gateway_serves_chat_and_streamed_completion(gateway: GatewayProcess) -> None:
    chat = post(
        gateway.url + "/v1/chat/completions",
        {
            "model": MODEL_NAME,
            "max_tokens": 8,
            "messages": [
                {"role": "system", "content": text(seed=3, words=40)},
                {"role": "user", "content": "hello"},
            ],
        },
    )
    assert chat["object"] == "chat.completion" and chat["model"] == MODEL_NAME
    assert chat["choices"][0]["message"]["role"] == "assistant"
    assert chat["usage"]["completion_tokens"] == 8 and chat["usage"]["prompt_tokens"] > 40

    body = {
        "model": MODEL_NAME,
        "prompt": text(seed=4, words=60),
        "max_tokens": 12,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    request = urllib.request.Request(
        gateway.url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    events: list[str] = []
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        for line in response:
            if line.startswith(b"data: "):
                events.append(line[6:].decode().strip())
    assert events[-1] == "[DONE]", events
    chunks = [json.loads(e) for e in events[:-1]]
    pieces = [c["choices"][0]["text"] for c in chunks if c.get("choices")]
    assert len(pieces) >= 2 and "".join(pieces)
    usage = next(c["usage"] for c in reversed(chunks) if c.get("usage"))
    assert usage["completion_tokens"] == 12


def test_gateway_hit_rates_are_rates_and_it_knows_the_capacity(
    gateway: GatewayProcess, vllm_engine: VllmServer
) -> None:
    system = text(seed=5, words=600)  # a long shared system prompt, then 5 questions
    cached_tokens = []
    for i in range(5):
        chat = post(
            gateway.url + "/v1/chat/completions",
            {
                "model": MODEL_NAME,
                "max_tokens": 4,
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"question {i}"},
                ],
            },
        )
        cached_tokens.append(cached(chat["usage"]))
    assert cached_tokens[0] == 0 and all(c >= 576 for c in cached_tokens[1:]), cached_tokens

    engine = parse_metrics(get(vllm_engine.url + "/metrics").decode())
    (info,) = engine.get("vllm:cache_config_info")
    capacity = int(info.labels["num_gpu_blocks"]) * int(info.labels["block_size"])
    deadline = time.monotonic() + 10
    while True:  # until a scrape after the requests has reached the gateway
        (node,) = summary(gateway)["nodes"]
        if node["actual_cached_tokens"] >= sum(cached_tokens) or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    assert node["engine_type"] == "vllm" and node["state"] == "healthy", node
    assert node["actual_cached_tokens"] >= sum(cached_tokens), node
    assert node["actual_hit_rate"] is not None and 0.5 < node["actual_hit_rate"] <= 1.0, node
    assert node["predicted_hit_rate"] is not None and node["predicted_hit_rate"] <= 1.0, node
    assert node["kv_usage"] is not None and 0.0 <= node["kv_usage"] <= 1.0, node
    assert node["running"] is not None and node["running"] >= 0.0, node  # smoothed over scrapes
    assert node["waiting"] is not None and node["waiting"] >= 0.0, node
    # capacity_tokens in the summary is the calibrated capacity (kvgate calibrate): none
    # here. The engine-reported KV capacity is kv_capacity_tokens, and in /metrics.
    assert node["calibrated"] is False and node["capacity_tokens"] is None, node
    assert node["kv_capacity_tokens"] == capacity, node
    gauge = re.search(
        rb'^kvgate_node_kv_capacity_tokens\{node="node-0"\} (\S+)$',
        get(gateway.url + "/metrics"),
        re.MULTILINE,
    )
    assert gauge is not None and float(gauge.group(1)) == capacity
