"""GET /admin/summary: one JSON document for the dashboard and ``kvgate status``."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvgate.gateway.gateway import Gateway


def _num(value: Any) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _decision_totals(raw: Any) -> dict[str, int]:
    """{kind: n}, from either {kind: n} or {kind: {reason: n}}."""
    totals = {"admit": 0, "queue": 0, "reject": 0, "degrade": 0}
    if isinstance(raw, dict):
        for kind, value in raw.items():
            if isinstance(value, dict):
                totals[kind] = totals.get(kind, 0) + sum(int(v) for v in value.values())
            elif isinstance(value, int | float):
                totals[kind] = totals.get(kind, 0) + int(value)
    return totals


def node_rows(gateway: Gateway) -> list[dict[str, Any]]:
    now = gateway.clock.now()
    routing = gateway.router.snapshot()
    per_node = routing.get("nodes", {}) if isinstance(routing, dict) else {}
    if isinstance(per_node, list):
        per_node = {row.get("node_id"): row for row in per_node if isinstance(row, dict)}
    ejected = gateway.pipeline.outlier.snapshot(now)  # passive failure detection
    rows = []
    for node_id, spec in sorted(gateway.specs.items()):
        node = gateway.nodes.get(node_id)
        info = per_node.get(node_id, {}) if isinstance(per_node, dict) else {}
        report = getattr(node, "report", None)
        state = getattr(node, "state", None)
        rows.append(
            {
                "node_id": node_id,
                "url": spec.url,
                "model": spec.model,
                "pool": spec.pool,
                "engine_type": spec.engine_type,
                "source": gateway.sources.get(node_id),
                "outlier": ejected.get(node_id),  # {state: ejected|probing, reason, …} or None
                "state": getattr(state, "value", state) or info.get("state"),
                "running": _num(getattr(report, "running", None)),
                "waiting": _num(getattr(report, "waiting", None)),
                "inflight_requests": _num(
                    info.get("inflight_requests", getattr(node, "inflight_requests", None))
                ),
                "inflight_tokens": _num(
                    info.get("inflight_tokens", getattr(node, "inflight_tokens", None))
                ),
                "kv_usage": _num(getattr(report, "kv_usage", None)),
                # engine-reported (vLLM: num_gpu_blocks x block_size of cache_config_info)
                "kv_capacity_tokens": _num(getattr(node, "kv_capacity_tokens", None)),
                "load": _num(info.get("load")),
                "predicted_hit_rate": _num(info.get("predicted_hit_rate")),
                "actual_hit_rate": _num(info.get("actual_hit_rate")),
                "cold_boost": _num(info.get("cold_boost")),
                "demotions": _num(info.get("demotions")),
                "expected_cached_tokens": _num(info.get("expected_cached_tokens")),
                "actual_cached_tokens": _num(info.get("actual_cached_tokens")),
                "report_age_s": _num(now - report.timestamp) if report is not None else None,
                **_capacity(gateway, node_id, spec.model),
            }
        )
    return rows


def _capacity(gateway: Gateway, node_id: str, model: str) -> dict[str, Any]:
    """The node's calibrated capacity (kvgate.calibrate.book); None when uncalibrated."""
    book = getattr(gateway, "capacity_book", None)
    if book is None:
        return {}
    profile = book.profile_for(node_id, model)
    version, deployment = book.ref_for(node_id, model)
    return {
        "capacity_profile": f"{version}@{deployment}",
        "capacity_tokens": profile.capacity_runtime_tokens if profile else None,
        "calibrated": profile is not None,
    }


def build_summary(gateway: Gateway) -> dict[str, Any]:
    config = gateway.config
    admission = gateway.admission.snapshot()
    routing = gateway.router.snapshot()
    tenants = []
    for row in (
        admission.get("tenants", [])
        if isinstance(admission.get("tenants"), list)
        else [{"name": k, **v} for k, v in (admission.get("tenants") or {}).items()]
    ):
        tenants.append(
            {
                k: row.get(k)
                for k in ("name", "guaranteed", "weight", "used", "hard_cap", "queue_depth")
            }
        )
    return {
        "gateway": {
            "id": config.gateway_id,
            "policy": getattr(gateway.router, "policy_name", None) or config.routing.policy,
            "uptime_s": round(time.monotonic() - gateway.started_at, 3),
            "store": config.store,
            "auth_enabled": gateway.tenants.auth_enabled,
            "flags": gateway.flags.as_dict(),
            "config_version": getattr(gateway, "config_version", None),
        },
        "nodes": node_rows(gateway),
        "tenants": tenants,
        "admission": {
            "enabled": bool(admission.get("enabled", gateway.flags.enabled("admission"))),
            "queue_depth": _num(admission.get("queue_depth")),
            "by_reason": admission.get("decisions_total", {}),
            "total_quota": _num(admission.get("total_quota")),
            "used": _num(admission.get("used")),
            "decisions_total": _decision_totals(admission.get("decisions_total")),
        },
        "routing": {
            "decisions_total": routing.get("decisions_total", {}),
            "cache_choice": _cache_choice(routing.get("cache_choice")),
        },
    }


def _cache_choice(raw: Any) -> dict[str, Any]:
    """Routing-decision quality (``routing.forgone``): the share of decisions that took the
    node with the longest cached prefix, and the cached tokens the others gave up."""
    raw = raw if isinstance(raw, dict) else {}
    return {
        "decisions": _num(raw.get("decisions")) or 0,
        "took_best": _num(raw.get("took_best")) or 0,
        "took_best_share": _num(raw.get("took_best_share")),
        "with_cached_prefix": _num(raw.get("with_cached_prefix")) or 0,
        "best_tokens": _num(raw.get("best_tokens")) or 0,
        "forgone_tokens": _num(raw.get("forgone_tokens")) or 0,
        "forgone_tokens_by_reason": dict(raw.get("forgone_tokens_by_reason") or {}),
        "left_best_by_reason": dict(raw.get("left_best_by_reason") or {}),
    }
