"""The route key: model version + digest of the stable prefix.

Inputs: leading system messages, tool schemas, the knowledge-base version (header, else
config). Never the ``user`` field, a session id or the API key — those would split one
shared prefix across nodes.
"""

from __future__ import annotations

from collections.abc import Mapping

import xxhash

from kvgate.routing.config import RouteKeyConfig


def header_value(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        lower = name.lower()
        for key, v in headers.items():
            if key.lower() == lower:
                return v
    return value


def prefix_digest(stable_prefix_text: str, kb_version: str | None) -> str:
    h = xxhash.xxh3_128()
    h.update(stable_prefix_text.encode())
    h.update(b"\x1fkb=")
    h.update((kb_version or "").encode())
    return h.hexdigest()[:24]


def route_key(model: str, digest: str) -> str:
    return f"{model}:{digest}"


def kb_version_for(headers: Mapping[str, str], config: RouteKeyConfig) -> str | None:
    return header_value(headers, config.kb_version_header) or config.kb_version
