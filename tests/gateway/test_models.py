"""``model`` resolution and X-KVGate-* headers on every answer, errors included."""

from __future__ import annotations

from typing import Any

import aiohttp

from tests.fixtures.engines import start_engine_process
from tests.fixtures.gateway import running_gateway
from tests.gateway._engines import MODEL, TIME_SCALE, engines


def chat(model: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    if model is not None:
        body["model"] = model
    return body


async def test_default_names_the_single_served_model() -> None:
    with engines(1) as started:
        cfg = {"nodes": [{"id": "e0", "url": started[0].url}]}  # model discovered: "sim"
        async with running_gateway(cfg) as gw, aiohttp.ClientSession() as s:
            for model in ("default", None, MODEL):
                async with s.post(gw.url + "/v1/chat/completions", json=chat(model)) as r:
                    assert r.status == 200, await r.text()
                    assert (await r.json())["model"] == MODEL  # the engine got the real name
                    assert r.headers["X-KVGate-Node"] == "e0"
                    assert r.headers["X-KVGate-Admission"].startswith("admit")
            for name in (MODEL, "default"):  # "default" names the one served model here too
                async with s.get(gw.url + f"/v1/models/{name}") as r:
                    assert r.status == 200 and (await r.json())["id"] == MODEL
            async with s.get(gw.url + "/v1/models/nope") as r:
                assert r.status == 404
                assert (await r.json())["error"]["code"] == "model_not_found"


async def test_ambiguous_or_unknown_model_is_a_404_listing_the_served_ones() -> None:
    other = start_engine_process(time_scale=TIME_SCALE, model="other-model")
    try:
        with engines(1) as started:
            cfg = {"nodes": [{"id": "e0", "url": started[0].url}, {"id": "e1", "url": other.url}]}
            async with running_gateway(cfg) as gw, aiohttp.ClientSession() as s:
                for model in ("default", None, "nope"):
                    headers = {"X-Request-Id": "rid-1"}
                    async with s.post(
                        gw.url + "/v1/chat/completions", json=chat(model), headers=headers
                    ) as r:
                        assert r.status == 404
                        error = (await r.json())["error"]
                        assert error["code"] == "model_not_found" and error["param"] == "model"
                        assert f"{MODEL}" in error["message"] and "other-model" in error["message"]
                        assert r.headers["X-Request-Id"] == "rid-1"
                async with s.post(gw.url + "/v1/chat/completions", json=chat("other-model")) as r:
                    assert r.status == 200 and r.headers["X-KVGate-Node"] == "e1"
    finally:
        other.stop()


async def test_errors_carry_the_headers_known_when_they_happen() -> None:
    with engines(1) as started:
        cfg = {
            "nodes": [{"id": "e0", "url": started[0].url}],
            "admission": {"tenants": [{"name": "default", "hard_cap": 10}]},
        }
        async with (
            running_gateway(cfg) as gw,
            aiohttp.ClientSession() as s,
            s.post(gw.url + "/v1/chat/completions", json=chat("default")) as r,
        ):
            assert r.status == 413  # more than the tenant may ever hold
            assert r.headers["X-KVGate-Admission"].startswith("reject; reason=too_large")
            assert r.headers["X-Request-Id"].startswith("req-")
            assert "X-KVGate-Node" not in r.headers  # never routed
    with engines(1) as started:
        cfg = {"nodes": [{"id": "e0", "url": started[0].url}], "flags": {"retries": False}}
        async with running_gateway(cfg) as gw, aiohttp.ClientSession() as s:
            started[0].kill()
            async with s.post(gw.url + "/v1/chat/completions", json=chat(MODEL)) as r:
                assert r.status == 502
                assert r.headers["X-KVGate-Node"] == "e0"  # the node that failed
                assert r.headers["X-KVGate-Admission"].startswith("admit")
                assert r.headers["X-Request-Id"]
