"""Engines that die: retries before the first byte, clean SSE errors after it, releases."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import aiohttp

from tests.fixtures.engines import EngineProcess, start_engine_process
from tests.fixtures.gateway import running_gateway
from tests.gateway._engines import MODEL, TIME_SCALE, engines

ADMIN = {"Authorization": "Bearer adm"}


def config(urls: list[str], **flags: bool) -> dict[str, Any]:
    return {
        "nodes": [{"id": f"e{i}", "url": u} for i, u in enumerate(urls)],
        "routing": {"scrape_interval_s": 0.5},
        "auth": {"admin_token": "adm"},
        "flags": flags,
    }


def body(i: int, *, stream: bool = False, max_tokens: int = 4) -> dict[str, Any]:
    # ignore_eos: the simulated engine generates exactly max_tokens (a long, busy request)
    return {"model": "sim", "stream": stream, "max_tokens": max_tokens, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"hello number {i}"}]}  # fmt: skip


async def inflight_total(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(url + "/admin/summary", headers=ADMIN) as r:
        summary = await r.json()
    return sum(n["inflight_requests"] or 0 for n in summary["nodes"])


async def test_killed_engine_loses_no_unary_request() -> None:
    with engines(3) as started:
        async with (
            running_gateway(config([e.url for e in started])) as gw,
            aiohttp.ClientSession() as s,
        ):

            async def one(i: int) -> tuple[int, str, float]:
                async with s.post(
                    gw.url + "/v1/chat/completions", json=body(i, max_tokens=300)
                ) as r:
                    await r.read()
                    return r.status, r.headers.get("X-KVGate-Node", ""), time.monotonic()

            # requests in flight on every node when e0 dies: those on e0 are retried
            tasks = [asyncio.create_task(one(i)) for i in range(12)]
            e0 = gw.gateway.nodes.get("e0")
            while e0.inflight_requests == 0:
                await asyncio.sleep(0.005)
            started[0].kill()
            killed_at = time.monotonic()
            results = await asyncio.gather(*tasks)
            assert [status for status, _, _ in results] == [200] * 12
            # an answer from e0 can only be one it finished before it died
            assert all(node != "e0" or done < killed_at for _, node, done in results)
            # and requests sent after the death never fail either
            for i in range(6):
                status, node, _ = await one(100 + i)
                assert status == 200 and node != "e0"
            retries = sum(
                gw.gateway.registry.get_sample_value("kvgate_retries_total", {"cause": c}) or 0
                for c in ("connect", "disconnected", "read", "http_5xx")
            )
            assert retries >= 1


async def test_retries_flag_off_gives_502_at_once() -> None:
    with engines(2) as started:
        urls = [e.url for e in started]
        async with running_gateway(config(urls, retries=False)) as gw, aiohttp.ClientSession() as s:
            started[0].kill()
            started[1].kill()
            async with s.post(gw.url + "/v1/chat/completions", json=body(1)) as r:
                assert r.status == 502
                error = (await r.json())["error"]
                assert "1 attempt" in error["message"]


async def test_engine_death_mid_stream_ends_with_sse_error() -> None:
    with engines(1) as started:
        async with running_gateway(config([started[0].url])) as gw, aiohttp.ClientSession() as s:
            async with s.post(
                gw.url + "/v1/chat/completions", json=body(1, stream=True, max_tokens=4000)
            ) as r:
                assert r.status == 200
                first = await r.content.readuntil(b"\n\n")
                assert first.startswith(b"data: ")
                started[0].kill()
                rest = await r.content.read()
            assert b'data: {"error": ' in rest
            assert rest.rstrip().endswith(b"data: [DONE]")
            assert await inflight_total(s, gw.url) == 0


async def test_client_disconnect_mid_stream_releases_everything() -> None:
    with engines(1) as started:
        async with running_gateway(config([started[0].url])) as gw:
            async with (
                aiohttp.ClientSession() as s,
                s.post(
                    gw.url + "/v1/chat/completions", json=body(1, stream=True, max_tokens=4000)
                ) as r,
            ):
                await r.content.readuntil(b"\n\n")
            # the client session is closed: the gateway notices at its next write
            registry = gw.gateway.registry
            for _ in range(200):
                if registry.get_sample_value("kvgate_inflight_requests") == 0:
                    break
                await asyncio.sleep(0.02)
            assert registry.get_sample_value("kvgate_inflight_requests") == 0
            assert registry.get_sample_value("kvgate_client_disconnects_total") == 1
            async with aiohttp.ClientSession() as s:
                assert await inflight_total(s, gw.url) == 0
            assert not gw.gateway.admission.snapshot().get("used")


# -- passive failure detection, timeouts, retry classes, cancellation (issue 11) --------
def sample(gw: Any, name: str, **labels: str) -> float:
    return gw.gateway.registry.get_sample_value(name, labels) or 0.0


async def settled_sample(gw: Any, name: str, expected: float, **labels: str) -> float:
    """``sample`` once it reads ``expected`` or 3 s have passed: with ``--workers`` a
    worker's counters reach the owner's registry by a push, shortly after the fact."""
    deadline = time.monotonic() + 3.0
    value = sample(gw, name, **labels)
    while value != expected and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        value = sample(gw, name, **labels)
    return value


def dispatches_to(gw: Any, node: str) -> float:
    """Attempts sent to ``node`` (first tries and retries), from kvgate_dispatches_total."""
    total = 0.0
    for family in gw.gateway.registry.collect():
        for s in family.samples:
            if s.name == "kvgate_dispatches_total" and s.labels.get("node") == node:
                total += s.value
    return total


def spread_body(i: int, **kw: Any) -> dict[str, Any]:
    payload = body(i, **kw)  # a system prompt per request: route keys on every node
    payload["messages"].insert(0, {"role": "system", "content": f"assistant {i}"})
    return payload


async def _load(
    s: aiohttp.ClientSession, url: str, stop: asyncio.Event, *, rate: float, **kw: Any
) -> list[tuple[float, float, int, str]]:
    """Non-streamed requests at ``rate``/s until ``stop``: (sent, latency, status, node)."""
    results: list[tuple[float, float, int, str]] = []

    async def one(i: int) -> None:
        sent = time.monotonic()
        payload = spread_body(i, **kw)
        async with s.post(url + "/v1/chat/completions", json=payload) as r:
            await r.read()
            node = r.headers.get("X-KVGate-Node", "")
            results.append((sent, time.monotonic() - sent, r.status, node))

    tasks = []
    i = 0
    while not stop.is_set():
        tasks.append(asyncio.create_task(one(i)))
        i += 1
        await asyncio.sleep(1.0 / rate)
    await asyncio.gather(*tasks)
    return results


class Load:
    """``_load`` (max_tokens 20) running in the background until ``finish``."""

    def __init__(self, s: aiohttp.ClientSession, url: str, *, rate: float) -> None:
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(_load(s, url, self.stop, rate=rate, max_tokens=20))

    async def finish(self) -> list[tuple[float, float, int, str]]:
        self.stop.set()
        return await self.task


def kill(engine: EngineProcess) -> int:
    """Kill an engine; its port, to restart it on."""
    port = int(engine.url.rsplit(":", 1)[1])
    engine.kill()
    return port


def restart(port: int) -> EngineProcess:
    return start_engine_process(
        time_scale=TIME_SCALE, model=MODEL, extra_args=["--base-port", str(port)]
    )


async def test_killed_engine_is_ejected_at_once_and_probed_back() -> None:
    with engines(4) as started:
        # no cold boost: its tiny age differences would keep the oldest node out of ties
        cfg = config([e.url for e in started], cold_boost=False)
        cfg["pipeline"] = {"outlier": {"base_ejection_s": 1.0}}
        # scrapes slower than the detection they back up: ejection is what takes e0 out
        cfg["routing"] = {"scrape_interval_s": 5.0}
        async with running_gateway(cfg) as gw, aiohttp.ClientSession() as s:
            load = Load(s, gw.url, rate=40)
            await asyncio.sleep(1.0)
            port = kill(started[0])
            killed_at = time.monotonic()
            outlier = gw.gateway.pipeline.outlier
            await asyncio.sleep(1.0 - (time.monotonic() - killed_at))
            one_second_after = dispatches_to(gw, "e0")
            await asyncio.sleep(2.5)
            # from 1 s after the kill on, no attempt (first try or retry) goes to the dead
            # node; its re-admission probes are health checks, not traffic
            assert dispatches_to(gw, "e0") == one_second_after
            assert "e0" in outlier.ejected()
            results = await load.finish()
            assert [r for r in results if r[2] != 200] == []  # 0 non-streamed failures
            assert (
                sample(gw, "kvgate_outlier_ejections_total", node="e0", reason="connect")
                + (sample(gw, "kvgate_outlier_ejections_total", node="e0", reason="disconnected"))
                >= 1
            )
            assert (
                sample(gw, "kvgate_outlier_ejected", node="e0", reason="connect")
                + sample(gw, "kvgate_outlier_ejected", node="e0", reason="disconnected")
                == 1
            )
            # restarted on its port: back in rotation within one probe interval
            span = outlier.snapshot(gw.gateway.clock.now())["e0"]["ejected_for_s"]
            restarted = restart(port)
            try:
                back_at = time.monotonic()
                while "e0" in outlier.ejected():
                    await asyncio.sleep(0.02)
                assert time.monotonic() - back_at <= float(span) + 0.5  # type: ignore[arg-type]
                assert sample(gw, "kvgate_outlier_probes_total", node="e0", result="ok") == 1
                before = dispatches_to(gw, "e0")
                for i in range(24):
                    async with s.post(gw.url + "/v1/chat/completions", json=spread_body(i)) as r:
                        assert r.status == 200
                assert dispatches_to(gw, "e0") > before
            finally:
                restarted.stop()


async def test_engine_restarted_after_a_long_outage_is_back_within_a_scrape_and_a_probe() -> None:
    scrape_s = 0.5
    with engines(3) as started:
        # default policy and cold boost: the restarted node must win traffic on its own
        cfg = config([e.url for e in started])
        cfg["routing"] = {"scrape_interval_s": scrape_s}
        cfg["pipeline"] = {"outlier": {"base_ejection_s": 1.0, "max_ejection_s": 30.0}}
        async with running_gateway(cfg) as gw, aiohttp.ClientSession() as s:
            load = Load(s, gw.url, rate=20)
            await asyncio.sleep(0.5)
            port = kill(started[0])
            outlier = gw.gateway.pipeline.outlier
            while "e0" not in outlier.ejected():
                await asyncio.sleep(0.02)
            # the node view shows the ejection: kvgate_node_state must not read healthy
            assert sample(gw, "kvgate_node_state", node="e0", state="backoff") == 1
            assert sample(gw, "kvgate_node_state", node="e0", state="healthy") == 0
            # down long enough for failed probes to double its ejection past 4 s
            await asyncio.sleep(7.5)
            span = outlier.snapshot(gw.gateway.clock.now())["e0"]["ejected_for_s"]
            assert float(span) > 4.0, span  # type: ignore[arg-type]
            before = dispatches_to(gw, "e0")
            restarted = restart(port)
            try:
                back_at = time.monotonic()  # the new process listens from here on
                while dispatches_to(gw, "e0") == before and time.monotonic() - back_at < 10:
                    await asyncio.sleep(0.02)
                waited = time.monotonic() - back_at
                # one scrape sees it back, its probe passes at once, then it takes work
                # (1 s of slack for a loaded 2-core machine; the ejection left was > 4 s)
                assert waited <= scrape_s + 1.0, (waited, span)
                assert (
                    sample(gw, "kvgate_outlier_recalls_total", node="e0", cause="restart")
                    + (sample(gw, "kvgate_outlier_recalls_total", node="e0", cause="report"))
                    >= 1
                )
                assert sample(gw, "kvgate_node_state", node="e0", state="backoff") == 0
                results = await load.finish()
                assert [r for r in results if r[2] != 200] == []
            finally:
                load.stop.set()
                restarted.stop()


async def test_three_of_four_dead_the_healthy_one_serves_everything() -> None:
    with engines(4) as started:
        async with (
            running_gateway(config([e.url for e in started])) as gw,
            aiohttp.ClientSession() as s,
        ):
            load = Load(s, gw.url, rate=40)
            await asyncio.sleep(0.5)
            for e in started[:3]:
                e.kill()
            killed_at = time.monotonic()
            await asyncio.sleep(3.0)
            results = await load.finish()
            late = [r for r in results if r[0] >= killed_at + 1.0]
            assert len(late) > 60
            assert [r for r in late if r[2] != 200] == []
            assert {r[3] for r in late} == {"e3"}
            assert gw.gateway.pipeline.outlier.ejected() == {"e0", "e1", "e2"}


HUNG_S = 20.0  # SIGSTOP length of the hung-engine test (issue 11's figure)


async def test_hung_engine_costs_at_most_first_byte_timeout_plus_one_retry() -> None:
    with engines(3) as started:
        cfg = config([e.url for e in started], cold_boost=False)
        cfg["server"] = {"first_byte_timeout_s": 1.0}
        cfg["pipeline"] = {"outlier": {"probe_timeout_s": 0.3, "base_ejection_s": 0.5}}
        async with running_gateway(cfg) as gw, aiohttp.ClientSession() as s:
            load = Load(s, gw.url, rate=20)
            await asyncio.sleep(0.5)
            hung = started[0].process.process
            hung.send_signal(signal.SIGSTOP)
            try:
                stopped_at = time.monotonic()
                # the fault: frozen for HUNG_S (its failed probes grow the ejection)
                await asyncio.sleep(3.0)
                # ejected: reads backoff (later unreachable, once its reports go stale)
                assert sample(gw, "kvgate_node_state", node="e0", state="backoff") == 1
                await asyncio.sleep(HUNG_S - 3.0)
                assert sample(gw, "kvgate_node_state", node="e0", state="healthy") == 0
            finally:
                hung.send_signal(signal.SIGCONT)
            resumed = time.monotonic()
            outlier = gw.gateway.pipeline.outlier
            while "e0" in outlier.ejected() and time.monotonic() - resumed < 10:
                await asyncio.sleep(0.02)
            # it recovered after SIGCONT: its next scrape answers, so it is probed at once
            # (not at the end of an ejection doubled by 20 s of failed probes)
            assert "e0" not in outlier.ejected()
            assert time.monotonic() - resumed <= 0.5 + 1.0
            back = dispatches_to(gw, "e0")
            await asyncio.sleep(1.0)
            results = await load.finish()
            assert dispatches_to(gw, "e0") > back  # and takes traffic again
            assert [r for r in results if r[2] != 200] == []
            # first-byte timeout + the health probe + one normal retry (well under 1 s)
            slowest = max(lat for sent, lat, _, _ in results if sent >= stopped_at - 0.5)
            assert slowest <= 1.0 + 0.3 + 1.0, slowest
            assert sample(gw, "kvgate_upstream_errors_total", node="e0", kind="timeout") >= 1


async def test_engine_answer_about_the_request_is_relayed_not_retried() -> None:
    with engines(3) as started:
        async with (
            running_gateway(config([e.url for e in started])) as gw,
            aiohttp.ClientSession() as s,
        ):
            bad = {**body(1), "n": 3}  # the engine refuses n != 1 (400), the gateway does not
            async with s.post(gw.url + "/v1/chat/completions", json=bad) as r:
                assert r.status == 400
                error = (await r.json())["error"]
                assert "n" in error["message"]
                assert r.headers["X-KVGate-Node"] in ("e0", "e1", "e2")
            assert dispatches_to(gw, "e0") + dispatches_to(gw, "e1") + dispatches_to(gw, "e2") == 1
            assert sample(gw, "kvgate_retries_total", cause="http_5xx") == 0
            assert gw.gateway.pipeline.outlier.ejected() == frozenset()


async def _engine_running(s: aiohttp.ClientSession, urls: list[str]) -> float:
    total = 0.0
    for url in urls:
        async with s.get(url + "/metrics") as r:
            for line in (await r.text()).splitlines():
                if line.startswith("vllm:num_requests_running"):
                    total += float(line.rsplit(" ", 1)[1])
    return total


async def test_clients_that_leave_cost_nothing() -> None:
    """Aborted unary and streamed requests are cancelled upstream and released; queued
    requests whose client left are dropped from the queue, never admitted."""
    with engines(2, time_scale=1.0) as started:
        urls = [e.url for e in started]
        cfg = config(urls)
        tokens_each = 2000 + 40  # max_tokens + prompt (about): 4 fit in the quota at once
        cfg["admission"] = {
            "total_quota": 4 * tokens_each,
            "queue": {"default_deadline_s": 60.0},
        }
        async with running_gateway(cfg) as gw, aiohttp.ClientSession() as s:
            core = gw.gateway.admission.core

            async def abandon(i: int, stream: bool, after: float) -> None:
                req = s.post(
                    gw.url + "/v1/chat/completions", json=body(i, stream=stream, max_tokens=2000)
                )
                try:
                    async with asyncio.timeout(after):
                        async with req as r:
                            await r.read()
                except TimeoutError:
                    pass

            # 4 running (2 unary, 2 streamed) fill the quota; 6 more wait in the queue
            running = [asyncio.create_task(abandon(i, i % 2 == 1, 1.5)) for i in range(4)]
            await asyncio.sleep(0.5)
            queued = [asyncio.create_task(abandon(10 + i, False, 0.5)) for i in range(6)]
            await asyncio.sleep(0.2)
            assert len(core.queue) == 6
            assert await _engine_running(s, urls) == 4
            admits_before = sum(core.decisions.counts["admit"].values())
            await asyncio.gather(*queued)  # their clients leave while queued
            for _ in range(100):  # the gateway sees each connection close
                if not len(core.queue):
                    break
                await asyncio.sleep(0.01)
            assert len(core.queue) == 0
            await asyncio.gather(*running)  # then the running ones' clients leave
            left_at = time.monotonic()
            while time.monotonic() - left_at < 2.0:
                if await _engine_running(s, urls) == 0 and len(core.ledger) == 0:
                    break
                await asyncio.sleep(0.05)
            assert await _engine_running(s, urls) == 0
            assert len(core.ledger) == 0 and not gw.gateway.admission.snapshot()["used"]
            assert sum(core.decisions.counts["admit"].values()) == admits_before
            assert sample(gw, "kvgate_cancellations_total", stage="queued") == 6
            assert sample(gw, "kvgate_cancellations_total", stage="upstream") == 4
            # counted as "client closed" (499), never as a gateway error
            chat = "/v1/chat/completions"
            closed = await settled_sample(
                gw, "kvgate_requests_total", 10, endpoint=chat, status="499"
            )
            assert closed == 10
            assert sample(gw, "kvgate_requests_total", endpoint=chat, status="500") == 0
