"""The engine-sim HTTP server, over real HTTP against `kvgate engine-sim` processes."""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvgate.prompts import render_chat
from kvgate.tokens import BLOCK_SIZE, count_tokens
from tests.fixtures.engines import EngineProcess, start_engine_process

MODEL = "sim-model"
SYSTEM = (
    "You are a support assistant for an online shop. Answer briefly and politely, cite the "
    "order number when you know it, and never invent prices or delivery dates for orders."
)


def expected_cached(n_tokens: int) -> int:
    """Cached full blocks of a repeated prompt; the last token is always recomputed."""
    full = n_tokens // BLOCK_SIZE * BLOCK_SIZE
    return full - BLOCK_SIZE if full == n_tokens else full


def post(url: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(
        url + path, data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def metrics(url: str) -> dict[str, dict[str, Any]]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    families = {}
    for fam in text_string_to_metric_families(text):
        families[fam.name] = {"type": fam.type, "samples": fam.samples}
    return families


def metric_value(url: str, name: str) -> float:
    fam = metrics(url)[name]
    wanted = name + "_total" if fam["type"] == "counter" else name
    return sum(s.value for s in fam["samples"] if s.name == wanted)


@pytest.fixture(scope="module")
def engine() -> Iterator[EngineProcess]:
    proc = start_engine_process(count=2, time_scale=200.0, model=MODEL)
    yield proc
    proc.stop()


def test_openai_client_non_stream_reports_cached_prefix(engine: EngineProcess) -> None:
    client = openai.OpenAI(base_url=engine.urls[0] + "/v1", api_key="none")
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Where is order 4711?"},
    ]
    n = count_tokens(render_chat(messages))
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8)
    assert first.usage is not None and first.usage.prompt_tokens == n
    assert first.usage.completion_tokens == 8
    assert first.choices[0].finish_reason == "length"
    second = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8)
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens_details.cached_tokens == expected_cached(n)
    assert second.choices[0].message.content == first.choices[0].message.content


def test_openai_client_stream_with_usage(engine: EngineProcess) -> None:
    client = openai.OpenAI(base_url=engine.urls[0] + "/v1", api_key="none")
    prompt = "Summarise the shipping policy for international orders in two sentences."
    stream = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=12,
        extra_body={"ignore_eos": True},
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text_chunks = [c for c in chunks if c.choices]
    assert len(text_chunks) == 12
    assert text_chunks[-1].choices[0].finish_reason == "length"
    usage = chunks[-1].usage
    assert not chunks[-1].choices and usage is not None
    assert usage.prompt_tokens == count_tokens(prompt) and usage.completion_tokens == 12
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 0
    # The same request without streaming returns the same text.
    status, body = post(
        engine.urls[0],
        "/v1/completions",
        {"model": MODEL, "prompt": prompt, "max_tokens": 12, "ignore_eos": True},
    )
    assert status == 200
    assert body["choices"][0]["text"] == "".join(c.choices[0].text for c in text_chunks)


def test_raw_sse_framing(engine: EngineProcess) -> None:
    request = urllib.request.Request(
        engine.urls[1] + "/v1/chat/completions",
        data=json.dumps(
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
        ).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        raw = resp.read().decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    first = json.loads(events[0][6:])
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"]["role"] == "assistant"


def test_output_length_controls(engine: EngineProcess) -> None:
    url = engine.urls[1]
    base = {"model": MODEL, "prompt": "Tell me about caches and blocks and tokens."}
    _, natural = post(url, "/v1/completions", {**base, "max_tokens": 1000})
    n_natural = natural["usage"]["completion_tokens"]
    assert 16 <= n_natural < 256 and natural["choices"][0]["finish_reason"] == "stop"
    _, longer = post(url, "/v1/completions", {**base, "max_tokens": 1000, "min_tokens": 300})
    assert longer["usage"]["completion_tokens"] == 300
    _, capped = post(url, "/v1/completions", {**base, "max_tokens": 5})
    assert capped["usage"]["completion_tokens"] == 5
    assert capped["choices"][0]["finish_reason"] == "length"
    _, stopped = post(url, "/v1/completions", {**base, "max_tokens": 1000, "stop": "."})
    assert stopped["choices"][0]["finish_reason"] == "stop"
    assert "." not in stopped["choices"][0]["text"]
    assert natural["choices"][0]["text"].startswith(stopped["choices"][0]["text"])
    assert stopped["usage"]["completion_tokens"] < n_natural


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/completions", {"prompt": "x", "max_tokens": "many"}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
        ("/v1/completions", {"max_tokens": 3}, 400, "prompt"),
        ("/v1/completions", {"prompt": "x", "stop": 5}, 400, "stop"),
        ("/v1/completions", {"prompt": "x", "n": 2}, 400, "n"),
        ("/v1/completions", {"prompt": "x", "min_tokens": 9, "max_tokens": 3}, 400, "min_tokens"),
        ("/v1/chat/completions", {"messages": []}, 400, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "x"}]}, 400, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "user"}], "stream": 1}, 400, "stream"),
        ("/v1/completions", {"prompt": "x", "model": "other"}, 404, "model"),
        ("/v1/completions", b"{not json", 400, None),
        ("/v1/completions", {"prompt": "word " * 9000}, 400, "prompt"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 9000}, 400, "prompt"),
    ],
)
def test_bad_requests_get_openai_errors(
    engine: EngineProcess, path: str, body: Any, status: int, param: str | None
) -> None:
    got, reply = post(engine.urls[1], path, body)
    assert got == status
    err = reply["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param and err["message"]
    if isinstance(body, dict) and ("word" in str(body.get("prompt")) or "9000" in str(body)):
        assert err["code"] == "context_length_exceeded" and "context length" in err["message"]


def test_models_health_and_metrics_names(engine: EngineProcess) -> None:
    with urllib.request.urlopen(engine.urls[0] + "/v1/models", timeout=10) as resp:
        models = json.loads(resp.read())
    assert models["data"][0]["id"] == MODEL
    with urllib.request.urlopen(engine.urls[0] + "/health", timeout=10) as resp:
        assert resp.status == 200
    fams = metrics(engine.urls[0])
    expected_types = {
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:prefix_cache_queries": "counter",
        "vllm:prefix_cache_hits": "counter",
        "vllm:num_preemptions": "counter",
        "vllm:prompt_tokens": "counter",
        "vllm:generation_tokens": "counter",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:cache_config_info": "gauge",
    }
    for name, kind in expected_types.items():
        assert fams[name]["type"] == kind, name
    for sample in fams["vllm:num_requests_running"]["samples"]:
        assert sample.labels == {"model_name": MODEL, "engine": "0"}
    info = fams["vllm:cache_config_info"]["samples"][0].labels
    assert info["block_size"] == "16" and int(info["num_gpu_blocks"]) == 2048


def test_engines_in_one_process_are_independent(engine: EngineProcess) -> None:
    prompt = "Independent engines keep their own caches. " * 8
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2}
    post(engine.urls[0], "/v1/completions", body)
    _, on_same = post(engine.urls[0], "/v1/completions", body)
    _, on_other = post(engine.urls[1], "/v1/completions", body)
    assert on_same["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert on_other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_reset_prefix_cache_endpoint(engine: EngineProcess) -> None:
    body = {"model": MODEL, "prompt": "Reset me please, the prefix is long enough. " * 4}
    body["max_tokens"] = 2
    post(engine.urls[1], "/v1/completions", body)
    _, warm = post(engine.urls[1], "/v1/completions", body)
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    status, _ = post(engine.urls[1], "/reset_prefix_cache", b"")
    assert status == 200
    _, cold = post(engine.urls[1], "/v1/completions", body)
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_kv_pressure_evicts_oldest_prefix_and_counters_show_it(
    sim_engines: Callable[..., EngineProcess],
) -> None:
    eng = sim_engines(kv_blocks=24, time_scale=200.0)  # 384 tokens of KV
    url = eng.url
    prompts = [f"Tenant {name} knowledge base: " + f"{name} facts " * 80 for name in "ABC"]
    sizes = [count_tokens(p) for p in prompts]
    assert all(150 < n < 190 for n in sizes)

    def cached(prompt: str) -> int:
        _, body = post(url, "/v1/completions", {"prompt": prompt, "max_tokens": 1})
        return int(body["usage"]["prompt_tokens_details"]["cached_tokens"])

    assert cached(prompts[0]) == 0
    assert cached(prompts[1]) == 0
    assert cached(prompts[0]) == expected_cached(sizes[0])  # A touched: now newest
    hits_before = metric_value(url, "vllm:prefix_cache_hits")
    queries_before = metric_value(url, "vllm:prefix_cache_queries")
    assert cached(prompts[2]) == 0  # C evicts the least recently used prefix: B
    assert cached(prompts[0]) == expected_cached(sizes[0])
    assert metric_value(url, "vllm:prefix_cache_hits") - hits_before == expected_cached(sizes[0])
    assert metric_value(url, "vllm:prefix_cache_queries") - queries_before == sizes[2] + sizes[0]
    assert cached(prompts[1]) < expected_cached(sizes[1])


def test_preemption_is_counted_when_blocks_run_out(
    sim_engines: Callable[..., EngineProcess],
) -> None:
    eng = sim_engines(kv_blocks=20, time_scale=500.0)  # 320 tokens
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int) -> dict[str, Any]:
        body = {"prompt": f"request {i} " * 20, "max_tokens": 200, "ignore_eos": True}
        return post(eng.url, "/v1/completions", body)[1]

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, range(4)))
    assert all(r["usage"]["completion_tokens"] == 200 for r in results)
    assert metric_value(eng.url, "vllm:num_preemptions") > 0
    assert metric_value(eng.url, "vllm:generation_tokens") == 800
    assert metric_value(eng.url, "vllm:num_requests_running") == 0


def test_sigterm_exits_cleanly_and_ends_inflight_streams() -> None:
    eng = start_engine_process(time_scale=1.0)
    try:
        body = {"prompt": "x", "max_tokens": 5000, "ignore_eos": True, "stream": True}
        request = urllib.request.Request(
            eng.url + "/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as resp:
            assert resp.readline().startswith(b"data: ")
            eng.process.send_signal(signal.SIGTERM)
            rest = resp.read().decode()
        assert "engine shutting down" in rest and rest.endswith("data: [DONE]\n\n")
        assert eng.process.wait(timeout=15) == 0
    except subprocess.TimeoutExpired:
        eng.kill()
        raise
    finally:
        eng.stop()


def test_streamed_text_with_stop_matches_the_non_streamed_text(engine: EngineProcess) -> None:
    client = openai.OpenAI(base_url=engine.urls[1] + "/v1", api_key="none")
    args: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a few sentences about caching."}],
        "max_tokens": 200,
        "stop": ["."],
    }
    whole = client.chat.completions.create(**args)
    chunks = list(client.chat.completions.create(**args, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content and streamed
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason == "stop"
