"""Store faults with real processes: Redis restart, a gateway frozen past its lease, and
a flag written while etcd is down."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from tests.fixtures.engines import EngineProcess, start_engine_process
from tests.fixtures.gateway import GatewayProcess

LEASE_TTL_S = 2.0
HEARTBEAT_S = LEASE_TTL_S / 3
USED_KEY = "kvgate:quota:used"


@pytest.fixture
def engine() -> Iterator[EngineProcess]:
    """One fast simulated engine, stopped after the test (before its gateways)."""
    started = start_engine_process(count=1, time_scale=50.0)
    try:
        yield started
    finally:
        started.stop()


def gateway_config(engine_url: str, store: str, **admission: Any) -> dict[str, Any]:
    return {
        "nodes": [{"id": "e0", "url": engine_url}],
        "store": store,
        "admission": {"lease_ttl_s": LEASE_TTL_S, "total_quota": 1_000_000, **admission},
        "routing": {"scrape_interval_s": 0.5},
    }


def post(url: str, body: dict[str, Any], timeout: float = 30.0) -> tuple[int, bytes]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}}" if want else f"{name} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read().decode()


def engine_running(engine_url: str) -> int:
    text = get_text(engine_url + "/metrics")
    found = re.search(r"^vllm:num_requests_running\{[^}]*\} ([0-9.]+)$", text, re.M)
    return int(float(found.group(1))) if found else 0


# -- Redis restart: one down, one up ---------------------------------------------------
def test_redis_restart_is_one_down_and_one_up_transition(
    fresh_redis_server: Any, gateway_factory: Callable[..., GatewayProcess], engine: EngineProcess
) -> None:
    gw = gateway_factory(config=gateway_config(engine.url, fresh_redis_server.url))
    statuses: list[int] = []
    stop = threading.Event()

    def load(worker: int) -> None:  # concurrent: the pool holds several connections
        i = 0
        while not stop.is_set():
            i += 1
            body = {"prompt": f"restart {worker} {i}", "max_tokens": 16, "stream": i % 2 == 0}
            statuses.append(post(gw.url + "/v1/completions", body)[0])
            time.sleep(0.1)

    workers = [threading.Thread(target=load, args=(w,)) for w in range(8)]
    for w in workers:
        w.start()
    try:
        time.sleep(1.5)
        fresh_redis_server.stop()
        time.sleep(1.0)
        fresh_redis_server.start()  # empty: no persistence
        time.sleep(4 * HEARTBEAT_S + 6.0)  # recovery window and many heartbeats
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=30)
    text = get_text(gw.url + "/metrics")
    assert metric(text, "kvgate_store_transitions_total", backend="redis", to="down") == 1
    assert metric(text, "kvgate_store_transitions_total", backend="redis", to="up") == 1
    assert metric(text, "kvgate_store_backend_up", backend="redis") == 1
    log = gw.log()
    # admission switched to local limits once and back once
    assert log.count("unreachable (") == 1, log[-3000:]
    assert log.count("reachable again") == 1, log[-3000:]
    assert statuses and all(s < 500 for s in statuses), sorted(set(statuses))
    assert len(statuses) > 40


# -- a gateway frozen past its lease ---------------------------------------------------
def test_frozen_gateway_re_registers_its_running_work(
    fresh_redis_server: Any, gateway_factory: Callable[..., GatewayProcess]
) -> None:
    streams, max_tokens = 4, 300
    engines = start_engine_process(count=1, time_scale=1.0)  # ~16 tokens/s: long requests
    r = redis.Redis.from_url(fresh_redis_server.url, decode_responses=True)
    try:
        config = gateway_config(engines.url, fresh_redis_server.url)
        frozen = gateway_factory(config=config)
        reaper = gateway_factory(config=config)  # its heartbeat reaps expired leases
        assert reaper.process.poll() is None

        def stream(i: int) -> None:
            body = {"prompt": f"frozen {i}", "max_tokens": max_tokens, "ignore_eos": True,
                    "stream": True}  # fmt: skip
            post(frozen.url + "/v1/completions", body, timeout=120)

        clients = [threading.Thread(target=stream, args=(i,)) for i in range(streams)]
        for c in clients:
            c.start()
        samples: list[tuple[float, int, int]] = []  # (time, redis used, engine running)

        def sample() -> tuple[int, int]:
            used = sum(int(v) for v in r.hgetall(USED_KEY).values())
            running = engine_running(engines.url)
            samples.append((time.monotonic(), used, running))
            return used, running

        deadline = time.monotonic() + 20
        while sample()[1] < streams:
            assert time.monotonic() < deadline, "the streams never all ran"
            time.sleep(0.05)
        t_stop = time.monotonic()
        os.kill(frozen.pid, signal.SIGSTOP)
        try:
            while time.monotonic() < t_stop + 3 * LEASE_TTL_S:
                sample()
                time.sleep(0.05)
        finally:
            t_cont = time.monotonic()
            os.kill(frozen.pid, signal.SIGCONT)
        deadline = time.monotonic() + 60
        while sample()[1] > 0:
            assert time.monotonic() < deadline, "the streams never finished"
            time.sleep(0.05)
        for c in clients:
            c.join(timeout=30)

        def under(used: int, running: int) -> bool:
            return used < running * max_tokens  # each holds prompt + its output bound

        lease_valid_until = t_stop + LEASE_TTL_S - HEARTBEAT_S
        early = [s for s in samples if s[0] < lease_valid_until and under(s[1], s[2])]
        late = [s for s in samples if s[0] > t_cont + LEASE_TTL_S and under(s[1], s[2])]
        frozen_gap = [
            s for s in samples if t_stop + LEASE_TTL_S < s[0] < t_cont and under(s[1], s[2])
        ]
        assert not early, early[:3]
        assert frozen_gap, "the lease never expired: the test did not test fencing"
        assert not late, late[:3]
        recovered = next(s[0] for s in samples if s[0] > t_cont and not under(s[1], s[2]))
        print(f"undercount ended {1000 * (recovered - t_cont):.0f} ms after SIGCONT")
        assert recovered - t_cont <= LEASE_TTL_S
        assert "re-acquired (lease_lost)" in frozen.log()
        # and nothing leaks once the work is done
        deadline = time.monotonic() + 5
        while sum(int(v) for v in r.hgetall(USED_KEY).values()) > 0:
            assert time.monotonic() < deadline, r.hgetall(USED_KEY)
            time.sleep(0.1)
    finally:
        r.close()
        engines.stop()


# -- a flag written during an etcd outage ----------------------------------------------
def test_flag_write_during_etcd_outage_is_refused_then_lands(
    fresh_etcd_server: Any, gateway_factory: Callable[..., GatewayProcess], engine: EngineProcess
) -> None:
    gw = gateway_factory(config=gateway_config(engine.url, fresh_etcd_server.url))
    other = gateway_factory(config=gateway_config(engine.url, fresh_etcd_server.url))
    fresh_etcd_server.stop()
    status, body = post(gw.url + "/admin/flags", {"cache_affinity": False}, timeout=20)
    assert status == 503, body
    assert json.loads(body)["error"]["code"] == "store_unavailable"
    # not applied locally either: the replicas still agree
    assert flags(gw)["cache_affinity"] is True
    assert flags(other)["cache_affinity"] is True
    fresh_etcd_server.start()
    deadline = time.monotonic() + 30
    while True:
        status, body = post(gw.url + "/admin/flags", {"cache_affinity": False}, timeout=20)
        if status == 200:
            break
        assert status == 503 and time.monotonic() < deadline, body
        time.sleep(0.5)
    deadline = time.monotonic() + 20
    while flags(other)["cache_affinity"] is not False:  # reached etcd, and the replica
        assert time.monotonic() < deadline, "the other replica never saw the flag"
        time.sleep(0.2)
    assert flags(gw)["cache_affinity"] is False


def flags(gw: GatewayProcess) -> dict[str, bool]:
    return dict(json.loads(get_text(gw.url + "/admin/flags"))["flags"])
