"""The route key: model version + digest of the stable prefix.

Inputs: leading system messages, tool schemas, the knowledge-base version (header, else
config). Never the ``user`` field, a session id or the API key — those would split one
shared prefix across nodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import xxhash

from kvgate.prompts import canonical_tools, stable_prefix
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


def chat_stable_text(
    messages: Sequence[Mapping[str, Any]], tools: Any, config: RouteKeyConfig
) -> str:
    """The stable part of a chat request that the route key covers (per RouteKeyConfig)."""
    system = stable_prefix(messages, None) if config.include_system_prompt else ""
    tool_text = canonical_tools(tools) if config.include_tools else ""
    return system + ("\x1ftools=" + tool_text if tool_text else "")


def route_key_for(
    model: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    config: RouteKeyConfig,
    tools: Any = None,
    headers: Mapping[str, str] | None = None,
) -> str:
    """The route key of a chat request: the one derivation the gateway and the workloads
    (hence the simulator) share."""
    stable = chat_stable_text(messages, tools, config)
    return route_key(model, prefix_digest(stable, kb_version_for(headers or {}, config)))
