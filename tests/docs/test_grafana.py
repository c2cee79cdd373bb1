"""deploy/grafana/kvgate.json is valid and queries only metrics the gateway exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tests.fixtures.gateway import running_gateway

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "kvgate.json"
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("_count", "_sum", "_created"),
    "gauge": ("",),
    "info": ("_info",),
}


def _queried_metrics(dashboard: dict[str, Any]) -> set[str]:
    names: set[str] = set()
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            names |= set(re.findall(r"\bkvgate_[a-z0-9_]+", target["expr"]))
    return names


async def _exported_series_names() -> set[str]:
    async with running_gateway({}) as gw:
        names: set[str] = set()
        for family in gw.gateway.registry.collect():
            for suffix in _SUFFIXES.get(family.type, ("",)):
                names.add(family.name + suffix)
            names |= {sample.name for sample in family.samples}
        return names


def test_dashboard_is_valid_grafana_json() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] and dashboard["uid"]
    assert dashboard["panels"], "no panels"
    for panel in dashboard["panels"]:
        assert panel["title"]
        assert panel["targets"], f"panel {panel['title']!r} has no query"


async def test_every_queried_metric_is_exported() -> None:
    queried = _queried_metrics(json.loads(DASHBOARD.read_text()))
    exported = await _exported_series_names()
    missing = sorted(queried - exported)
    assert not missing, f"dashboard queries metrics the gateway does not export: {missing}"
    # the mechanisms the issue names each have a panel
    for needed in (
        "kvgate_route_expected_cached_tokens_total",
        "kvgate_route_actual_cached_tokens_total",
    ):
        assert needed in queried
