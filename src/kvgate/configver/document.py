"""The versioned part of the config: routing, admission (with tenants), flags, capacity profiles.

Server, nodes, store, auth and scrape settings belong to one process and stay in its
file; everything a replica can change while running is in the *document*.
"""

from __future__ import annotations

import json
from typing import Any

from kvgate.flags import Flags
from kvgate.gateway.config import ConfigError, GatewayConfig, parse_config

SECTIONS = ("routing", "admission", "flags", "capacity_profiles")
PROCESS_SECTIONS = ("server", "nodes", "store", "auth", "scrape")


def document_of(config: GatewayConfig, flags: Flags | None = None) -> dict[str, Any]:
    """The effective document of a running config (flags: the live values, all of them)."""
    data = config.model_dump(mode="json")
    doc = {name: data[name] for name in SECTIONS}
    doc["flags"] = dict(flags.as_dict()) if flags is not None else {**Flags(config.flags)}
    return doc


def merge_document(
    base: dict[str, Any], update: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """Sections in ``update`` replace those of ``base``; flags merge key by key.

    Returns the new document and the process-local sections that were ignored.
    """
    if not isinstance(update, dict):
        raise ConfigError("the config file must be a mapping")
    unknown = sorted(set(update) - set(SECTIONS) - set(PROCESS_SECTIONS))
    if unknown:
        raise ConfigError(
            f"{unknown[0]}: unknown section; versioned sections: {', '.join(SECTIONS)}"
        )
    doc = json.loads(json.dumps(base))
    for name in SECTIONS:
        if name not in update:
            continue
        if name == "flags" and isinstance(update[name], dict):
            doc["flags"] = {**doc.get("flags", {}), **update[name]}
        else:
            doc[name] = update[name]
    return doc, [s for s in PROCESS_SECTIONS if s in update]


def validate_document(doc: dict[str, Any], process: GatewayConfig | None = None) -> GatewayConfig:
    """The full config this document gives a process; ConfigError names the field."""
    base = process.model_dump(mode="json") if process is not None else {}
    merged = {k: v for k, v in base.items() if k not in SECTIONS}
    merged.update({k: doc[k] for k in SECTIONS if k in doc})
    return parse_config(merged)
