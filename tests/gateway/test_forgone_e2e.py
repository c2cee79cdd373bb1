"""Routing-decision quality behind ``kvgate serve`` with engine-sims: a load-guard spill
is counted as forgone cached tokens and lowers the took-best share below 1; a pure
affinity workload keeps it at 1. Read from /admin/summary, /metrics and ``kvgate status``."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvgate.tokens import synthetic_text
from tests.fixtures.gateway import GatewayProcess, start_gateway_process
from tests.gateway._engines import Engine, engines

ADMIN_TOKEN = "forgone-admin"
PREFIX_TOKENS = 320
# the engines' prompt compute in real time, and the gateway's prefill model of it: a long
# prompt really holds its node for seconds, so the test does not race the engine
PREFILL_TOKENS_PER_S = 1000.0


@pytest.fixture(scope="module")
def two_engines() -> Iterator[list[Engine]]:
    options = ["--prefill-tokens-per-s", str(PREFILL_TOKENS_PER_S)]
    with engines(2, separate=False, time_scale=1.0, extra_args=options) as started:
        yield started


@pytest.fixture
def gateway(two_engines: list[Engine]) -> Iterator[GatewayProcess]:
    config = {
        "nodes": [{"id": f"e{i}", "url": e.url} for i, e in enumerate(two_engines)],
        "routing": {"scrape_interval_s": 0.5, "prefill_tokens_per_s": PREFILL_TOKENS_PER_S},
        "auth": {"admin_token": ADMIN_TOKEN},
    }
    gw = start_gateway_process(config=config)
    try:
        yield gw
    finally:
        gw.stop()


def system_prompt(group: int) -> str:
    return f"You are agent {group}." + synthetic_text(PREFIX_TOKENS, random.Random(group))


def chat(url: str, group: int, question: str) -> tuple[dict[str, str], dict[str, Any]]:
    body = {
        "model": "sim",
        "max_tokens": 4,
        "messages": [
            {"role": "system", "content": system_prompt(group)},
            {"role": "user", "content": question},
        ],
    }
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200
        return dict(response.headers), json.loads(response.read())


def admin_get(url: str, path: str) -> bytes:
    request = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return bytes(response.read())


def cache_choice(url: str) -> dict[str, Any]:
    summary = json.loads(admin_get(url, "/admin/summary"))
    return dict(summary["routing"]["cache_choice"])


def samples(url: str, name: str) -> dict[str, float]:
    """``{label value: sample}`` of a one-label counter on /metrics (its ``_total``)."""
    text = admin_get(url, "/metrics").decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[next(iter(s.labels.values()), "")] = s.value
    return out


def status_text(url: str) -> str:
    env = {**os.environ, "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-m", "kvgate", "status", "--gateway", url, "--admin-token", ADMIN_TOKEN],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    )
    return " ".join(done.stdout.split())


def test_pure_affinity_takes_the_best_node_every_time(gateway: GatewayProcess) -> None:
    for rep in range(3):
        for group in range(4):
            headers, _ = chat(gateway.url, group, f"question {rep} for {group}")
            if rep:
                assert headers["X-KVGate-Route-Reason"] == "prefix_match"
    q = cache_choice(gateway.url)
    assert q["decisions"] == 12 and q["took_best"] == 12 and q["took_best_share"] == 1.0
    assert q["with_cached_prefix"] == 8 and q["best_tokens"] > 0
    assert q["forgone_tokens"] == 0 and q["forgone_tokens_by_reason"] == {}
    took = samples(gateway.url, "kvgate_route_cache_best_decisions_total")
    assert took.get("true") == 12 and not took.get("false")
    assert not samples(gateway.url, "kvgate_route_cache_forgone_tokens_total")
    assert "best cached node 100.0% of 12 decisions" in status_text(gateway.url)


def spill_once(url: str) -> int:
    """Warm a prefix on one node, then send two long questions on it at once: the first
    keeps the prefix's node, the second spills by cost. Returns the tokens it forwent."""
    warm_headers, _ = chat(url, 7, "warm")
    owner = warm_headers["X-KVGate-Node"]
    # two long questions on the warm prefix at once: the first queues ~2,000 uncached
    # prompt tokens on the owner (~2 s of prefill there), so the second is cheaper to
    # prefill from scratch on the other node (its ~320 cached tokens save ~0.3 s)
    long_questions = [synthetic_text(2000, random.Random(100 + i)) for i in range(2)]
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda q: chat(url, 7, q), long_questions))
    reasons = sorted(h["X-KVGate-Route-Reason"] for h, _ in answers)
    assert reasons == ["cost_spill", "prefix_match"], reasons
    kept = next(h for h, _ in answers if h["X-KVGate-Route-Reason"] == "prefix_match")
    spilled = next(h for h, _ in answers if h["X-KVGate-Route-Reason"] == "cost_spill")
    assert kept["X-KVGate-Node"] == owner and spilled["X-KVGate-Node"] != owner
    forgone = int(kept["X-KVGate-Expected-Cached-Tokens"]) - int(
        spilled["X-KVGate-Expected-Cached-Tokens"]
    )
    assert forgone > 0
    return forgone


def test_load_guard_spill_is_counted_as_forgone_tokens(gateway: GatewayProcess) -> None:
    forgone = spill_once(gateway.url)
    q = cache_choice(gateway.url)
    assert q["decisions"] == 3 and q["took_best"] == 2
    assert q["took_best_share"] == pytest.approx(2 / 3) and q["took_best_share"] < 1
    assert q["forgone_tokens_by_reason"] == {"cost_spill": forgone}
    assert q["left_best_by_reason"] == {"cost_spill": 1}
    assert samples(gateway.url, "kvgate_route_cache_forgone_tokens_total") == {
        "cost_spill": forgone
    }
    took = samples(gateway.url, "kvgate_route_cache_best_decisions_total")
    assert took == {"true": 2, "false": 1}
    text = status_text(gateway.url)
    assert "best cached node 66.7% of 3 decisions" in text
    assert f"(cost_spill {forgone:,})" in text
