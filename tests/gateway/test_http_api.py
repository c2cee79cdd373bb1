"""HTTP behaviour that needs no engine: errors, auth, admin, flags, metrics (in-process)."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from kvgate.gateway.auth import is_loopback_host
from tests.fixtures.gateway import running_gateway

ADMIN = {"Authorization": "Bearer s3cret"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


def assert_openai_error(body: dict[str, Any], *, param: str | None = None) -> None:
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    if param is not None:
        assert error["param"] == param


@pytest.fixture
async def gateway():
    config = {"server": {"max_body_bytes": 2048}, "auth": {"admin_token": "s3cret"}}
    async with running_gateway(config) as gw:
        yield gw


async def post(url: str, **kwargs: Any) -> tuple[int, dict[str, Any], Any]:
    async with aiohttp.ClientSession() as s, s.post(url, **kwargs) as r:
        return r.status, dict(r.headers), await r.json(content_type=None)


async def get(url: str, **kwargs: Any) -> tuple[int, dict[str, Any], Any]:
    async with aiohttp.ClientSession() as s, s.get(url, **kwargs) as r:
        text = await r.text()
        try:
            import json

            return r.status, dict(r.headers), json.loads(text)
        except ValueError:
            return r.status, dict(r.headers), text


async def test_bad_json_and_missing_fields(gateway) -> None:
    status, _, body = await post(gateway.url + "/v1/chat/completions", data=b"{not json")
    assert status == 400
    assert_openai_error(body)
    status, _, body = await post(gateway.url + "/v1/chat/completions", json={"model": "m"})
    assert status == 400
    assert_openai_error(body, param="messages")
    status, _, body = await post(gateway.url + "/v1/completions", json={"model": "m"})
    assert status == 400
    assert_openai_error(body, param="prompt")
    status, _, body = await post(
        gateway.url + "/v1/chat/completions", json={**CHAT, "stream": "yes"}
    )
    assert status == 400
    assert_openai_error(body, param="stream")
    status, _, body = await post(gateway.url + "/v1/chat/completions", json=[1, 2])
    assert status == 400


async def test_body_too_large_is_413(gateway) -> None:
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}
    status, _, body = await post(gateway.url + "/v1/chat/completions", json=big)
    assert status == 413
    assert_openai_error(body)


async def test_unknown_route_is_openai_404(gateway) -> None:
    status, _, body = await get(gateway.url + "/v1/nothing")
    assert status == 404
    assert_openai_error(body)


async def test_no_nodes_is_503(gateway) -> None:
    status, _, body = await post(gateway.url + "/v1/chat/completions", json=CHAT)
    assert status == 503
    assert_openai_error(body)


async def test_health_and_metrics(gateway) -> None:
    status, _, body = await get(gateway.url + "/health")
    assert status == 200 and body["status"] == "ok"
    await get(gateway.url + "/v1/nothing")
    status, _headers, text = await get(gateway.url + "/metrics")
    assert status == 200
    assert 'kvgate_requests_total{endpoint="unmatched",status="404"} 1.0' in text
    assert "kvgate_inflight_requests" in text
    assert "kvgate_request_duration_seconds" in text


async def test_admin_requires_token(gateway) -> None:
    status, _headers, body = await get(gateway.url + "/admin/nodes")
    assert status == 401
    assert_openai_error(body)
    status, _, _ = await get(gateway.url + "/admin/nodes", headers={"Authorization": "Bearer x"})
    assert status == 401
    status, _, body = await get(gateway.url + "/admin/nodes", headers=ADMIN)
    assert status == 200 and body == {"nodes": []}


async def test_flags_roundtrip_and_unknown_flag(gateway) -> None:
    status, _, body = await get(gateway.url + "/admin/flags", headers=ADMIN)
    assert status == 200 and body["flags"]["retries"] is True
    status, _, body = await post(
        gateway.url + "/admin/flags", json={"retries": False}, headers=ADMIN
    )
    assert status == 200 and body["flags"]["retries"] is False
    assert gateway.gateway.flags.enabled("retries") is False
    assert await gateway.gateway.store.get("/kvgate/flags/retries") == "off"
    status, _, body = await post(
        gateway.url + "/admin/flags", json={"warp_drive": True}, headers=ADMIN
    )
    assert status == 400
    assert_openai_error(body, param="warp_drive")
    status, _, body = await post(
        gateway.url + "/admin/flags", json={"retries": "no"}, headers=ADMIN
    )
    assert status == 400


async def test_admin_node_validation(gateway) -> None:
    status, _, body = await post(
        gateway.url + "/admin/nodes", json={"id": "n", "url": "ftp://x"}, headers=ADMIN
    )
    assert status == 400 and "url" in body["error"]["message"]
    async with aiohttp.ClientSession() as s:
        async with s.delete(gateway.url + "/admin/nodes/nope", headers=ADMIN) as r:
            assert r.status == 404
        async with s.post(
            gateway.url + "/admin/nodes/nope/state", json={"state": "quiescing"}, headers=ADMIN
        ) as r:
            assert r.status == 404


async def test_summary_schema(gateway) -> None:
    status, _, body = await get(gateway.url + "/admin/summary", headers=ADMIN)
    assert status == 200
    assert set(body) >= {"gateway", "nodes", "tenants", "admission", "routing"}
    assert set(body["gateway"]) >= {"id", "policy", "uptime_s", "store", "auth_enabled", "flags"}
    assert body["gateway"]["store"] == "memory://"
    assert set(body["admission"]) >= {"enabled", "total_quota", "used", "decisions_total"}


async def test_config_hides_secrets(gateway) -> None:
    status, _, body = await get(gateway.url + "/admin/config", headers=ADMIN)
    assert status == 200
    assert body["config"]["auth"]["admin_token"] == "***"


async def test_dashboard_follows_admin_rule(gateway) -> None:
    status, _, _ = await get(gateway.url + "/dashboard")
    assert status == 401
    status, _, _ = await get(gateway.url + "/dashboard?token=s3cret")
    assert status in (200, 404)  # 404 only while the dashboard page is not installed


async def test_admin_without_token_only_on_loopback() -> None:
    assert is_loopback_host("127.0.0.1") and is_loopback_host("::1")
    assert is_loopback_host("localhost")
    assert not is_loopback_host("0.0.0.0") and not is_loopback_host("10.1.2.3")
    async with running_gateway({}) as gw:
        status, _, _ = await get(gw.url + "/admin/flags")
        assert status == 200
