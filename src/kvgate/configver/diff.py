"""A readable diff between two config documents: one line per changed leaf."""

from __future__ import annotations

import json
from typing import Any


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """{"admission.tenants[name=a].hard_cap": 24000, ...}; list items keyed by name if any."""
    out: dict[str, Any] = {}
    if isinstance(value, dict):
        if not value and prefix:
            out[prefix] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(value, list) and value and all(isinstance(x, dict) for x in value):
        for i, item in enumerate(value):
            label = _item_label(item, i)
            out.update(flatten(item, f"{prefix}[{label}]"))
    else:
        out[prefix] = value
    return out


def _item_label(item: dict[str, Any], index: int) -> str:
    for key in ("name", "id", "model_version"):
        if isinstance(item.get(key), str):
            extra = (
                f"/{item['deployment']}" if key == "model_version" and "deployment" in item else ""
            )
            return f"{key}={item[key]}{extra}"
    return str(index)


def _show(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def diff_documents(old: dict[str, Any] | None, new: dict[str, Any]) -> list[str]:
    """Lines ``path: old -> new``, ``+ path: new``, ``- path: old``, sorted by path."""
    a, b = flatten(old or {}), flatten(new)
    lines = []
    for path in sorted(a.keys() | b.keys()):
        if path not in a:
            lines.append(f"+ {path}: {_show(b[path])}")
        elif path not in b:
            lines.append(f"- {path}: {_show(a[path])}")
        elif a[path] != b[path]:
            lines.append(f"~ {path}: {_show(a[path])} -> {_show(b[path])}")
    return lines
