"""Where the router's "which node holds this prefix" guess comes from.

The router scores nodes from one object with the ``PrefixIndex.match`` shape: given a
request's chained block hashes, the current time and the candidate nodes, it returns how
many leading blocks each node holds. By default that is the router's own approximate
index (fed by what the gateway routed); a precise source — an index fed by the engines'
KV-cache events — has the same method and replaces it without changing any policy.
A source that knows the engines' own token counts also answers ``match_tokens`` (expected
cached tokens per node, in the engine's units); policies prefer it where it is there.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

from kvgate.types import RouteRequest


class CacheSignal(Protocol):
    def match(
        self,
        block_hashes: Sequence[int],
        now: float,
        nodes: Iterable[str] | None = None,
        max_age_s: float | None = None,
    ) -> dict[str, int]:
        """Per node, the number of leading blocks of ``block_hashes`` it holds (seen within
        ``max_age_s``, where the source keeps ages)."""
        ...


@runtime_checkable
class TokenCacheSignal(Protocol):
    def match_tokens(
        self, req: RouteRequest, now: float, nodes: Iterable[str] | None = None
    ) -> dict[str, int]:
        """Per node, the prompt tokens its engine is expected to find cached (> 0 only)."""
        ...
