"""The /dashboard page in real headless Chromium against a real gateway and engines."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.gateway import GatewayProcess, admin_gateway, chat_once

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ADMIN_TOKEN = "dash-admin-token"
TENANTS = [
    {"name": "interactive-app", "api_keys": ["k-app"], "guaranteed": 8000, "weight": 2},
    {"name": "nightly-batch", "api_keys": ["k-batch"], "guaranteed": 2000, "hard_cap": 6000},
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian chromium is not installed at /usr/bin/chromium")
    with admin_gateway(
        engines=3, node_prefix="gpu-", tenants=TENANTS, admin_token=ADMIN_TOKEN
    ) as gw:
        for key in ("k-app", "k-app", "k-batch"):
            chat_once(gw.url, key)
        yield gw


def _launch(playwright):  # type: ignore[no-untyped-def]
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def test_dashboard_shows_every_node_and_tenant(gateway: GatewayProcess) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = _launch(p)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            problems: list[str] = []
            page.on(
                "console",
                lambda msg: problems.append(msg.text) if msg.type in ("error", "warning") else None,
            )
            page.on("pageerror", lambda exc: problems.append(str(exc)))
            requests: list[str] = []
            page.on("request", lambda req: requests.append(req.url))
            page.goto(f"{gateway.url}/dashboard?token={ADMIN_TOKEN}")
            page.wait_for_selector("body[data-loaded=true]", timeout=15_000)
            for i in range(3):
                row = page.locator(f"#nodes tr[data-node='gpu-{i}']")
                assert row.count() == 1
                assert row.locator(".state").inner_text() in ("healthy", "re-register")
            for tenant in ("interactive-app", "nightly-batch"):
                assert page.locator(f"#tenants tr[data-tenant='{tenant}']").count() == 1
            assert page.inner_text("#gw-policy") == "hybrid"
            assert "API keys" in page.inner_text("#gw-auth")
            admit = page.locator("#admission-rates [data-kind=admit]").inner_text()
            assert "3 total" in admit or "4 total" in admit, admit
            # a second poll turns cumulative counters into per-second rates
            page.wait_for_function(
                "document.querySelector('#admission-rates [data-kind=admit] .n')"
                ".textContent !== '—'",
                timeout=10_000,
            )
            assert page.inner_text("#conn") == "live"
            ARTIFACTS.mkdir(exist_ok=True)
            shot = ARTIFACTS / "dashboard.png"
            page.screenshot(path=str(shot), full_page=True)
            print(f"dashboard screenshot: {shot}")
            assert problems == [], problems
            outside = [u for u in requests if not u.startswith(gateway.url)]
            assert outside == [], f"the page fetched outside the gateway: {outside}"
        finally:
            browser.close()


def test_dashboard_reports_a_refused_token(gateway: GatewayProcess) -> None:
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{gateway.url}/dashboard?token=wrong", timeout=10)
    assert refused.value.code == 401
    from playwright.sync_api import sync_playwright

    # The page itself loads with the right token; if the summary is then refused
    # (token rotated) the page says so instead of showing stale numbers.
    with sync_playwright() as p:
        browser = _launch(p)
        try:
            page = browser.new_page()
            page.route(
                "**/admin/summary",
                lambda route: route.continue_(
                    headers={**route.request.headers, "authorization": "Bearer rotated"}
                ),
            )
            page.goto(f"{gateway.url}/dashboard?token={ADMIN_TOKEN}")
            page.wait_for_selector("#error", state="visible", timeout=10_000)
            assert "401" in page.inner_text("#error")
            assert page.inner_text("#conn") == "disconnected"
        finally:
            browser.close()
