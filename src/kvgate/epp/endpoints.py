"""Nodes as Envoy names them: ``ip:port`` endpoints (ORIGINAL_DST reads no host names)."""

from __future__ import annotations

import functools
import ipaddress
import socket
from urllib.parse import urlsplit

from kvgate.gateway.gateway import Gateway


@functools.lru_cache(maxsize=1024)
def address(url: str) -> str:
    """``ip:port`` of a node's base URL (a host name resolved once, IPv6 bracketed)."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = ipaddress.ip_address(socket.gethostbyname(host))
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def node_address(gateway: Gateway, node_id: str) -> str | None:
    url = gateway.node_url(node_id)
    return address(url) if url is not None else None


def outside(gateway: Gateway, subset: frozenset[str]) -> tuple[frozenset[str], int]:
    """(the nodes whose endpoint is not in ``subset``, how many nodes are in it)."""
    excluded = []
    for node_id, spec in gateway.specs.items():
        if address(spec.url) not in subset:
            excluded.append(node_id)
    return frozenset(excluded), len(gateway.specs) - len(excluded)
