"""Fetch ``GET /admin/summary`` from a gateway, with errors a person can act on."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


class SummaryError(RuntimeError):
    """The summary could not be fetched; the message says why and what to try."""


def summary_url(gateway: str) -> str:
    base = gateway.rstrip("/")
    if not base.startswith(("http://", "https://")):
        base = "http://" + base
    return base + "/admin/summary"


def fetch_summary(gateway: str, admin_token: str | None = None, timeout_s: float = 5.0) -> Any:
    url = summary_url(gateway)
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    if admin_token:
        request.add_header("Authorization", f"Bearer {admin_token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        detail = _error_message(exc.read())
        if exc.code == 401:
            hint = "pass the right --admin-token" if admin_token else "pass --admin-token"
            raise SummaryError(f"{url}: admin token refused (401: {detail}); {hint}") from None
        if exc.code == 403:
            raise SummaryError(f"{url}: admin API refused (403: {detail})") from None
        raise SummaryError(f"{url}: HTTP {exc.code}: {detail}") from None
    except urllib.error.URLError as exc:
        raise SummaryError(f"gateway unreachable at {url}: {exc.reason}") from None
    except (TimeoutError, OSError) as exc:
        raise SummaryError(f"gateway unreachable at {url}: {exc}") from None
    try:
        summary = json.loads(body)
    except ValueError:
        raise SummaryError(f"{url}: the answer is not JSON (is this a kvgate gateway?)") from None
    if not isinstance(summary, dict) or "gateway" not in summary:
        raise SummaryError(f"{url}: the answer is not a kvgate summary")
    return summary


def _error_message(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body.decode("utf-8", "replace").strip()[:200] or "no detail"
