"""The dashboard's best-cached-node tiles in real headless Chromium, after a load-guard
spill behind ``kvgate serve`` with engine-sims."""

from __future__ import annotations

import os

import pytest

from tests.fixtures.gateway import GatewayProcess
from tests.gateway.test_forgone_e2e import ADMIN_TOKEN, gateway, spill_once, two_engines

pytestmark = pytest.mark.browser
__all__ = ["gateway", "two_engines"]  # fixtures shared with the e2e module

CHROMIUM = "/usr/bin/chromium"


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian chromium is not installed")
def test_dashboard_shows_the_took_best_share_and_forgone_tokens(gateway: GatewayProcess) -> None:
    from playwright.sync_api import sync_playwright

    forgone = spill_once(gateway.url)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"]
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            problems: list[str] = []
            page.on("pageerror", lambda exc: problems.append(str(exc)))
            page.goto(f"{gateway.url}/dashboard?token={ADMIN_TOKEN}")
            page.wait_for_selector("body[data-loaded=true]", timeout=15_000)
            box = page.locator("#cache-choice")
            assert box.locator("[data-kind=took_best_share] .n").inner_text() == "66.7%"
            assert "2 of 3" in box.locator("[data-kind=took_best_share] .l").inner_text()
            assert box.locator("[data-kind=forgone_tokens] .n").inner_text() == f"{forgone:,}"
            spill = box.locator("[data-kind='forgone:cost_spill'] .n")
            assert spill.inner_text() == f"{forgone:,}"
            assert problems == [], problems
        finally:
            browser.close()
