"""Binds a precise index to one router's node view, for policy ``precise`` to find.

The routing context a policy sees carries the node view but (today) no second cache
signal, so the event index is looked up by the node view it serves: each gateway replica
and each simulated cluster has its own node view, hence its own index. Weakly keyed, so a
discarded router takes its binding with it.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvgate.kv_events.index import PreciseIndex
from kvgate.kv_events.metrics import KvEventMetrics

if TYPE_CHECKING:  # a runtime import would circle back through kvgate.routing's policies
    from kvgate.routing.cache_signal import CacheSignal


@dataclass(slots=True)
class PreciseSignal:
    index: PreciseIndex
    metrics: KvEventMetrics
    block_size: int = 16  # the engines' KV block size (tokens per event block hash)


_BOUND: weakref.WeakKeyDictionary[object, PreciseSignal] = weakref.WeakKeyDictionary()


def bind_signal(node_view: object, signal: PreciseSignal) -> None:
    _BOUND[node_view] = signal


def unbind_signal(node_view: object) -> None:
    _BOUND.pop(node_view, None)


def signal_for(node_view: object) -> PreciseSignal | None:
    return _BOUND.get(node_view)


# How long the gateway's own dispatch of a prefix to a synced node stands in for the
# engine's event: blocks just sent are not cached yet (prefill runs, events travel), but
# a request routed now will find them there. Above the live event lag p99 seen (< 0.3 s).
PENDING_S = 1.0


class CombinedSignal:
    """A router cache signal (``CacheSignal``): the engines' events for nodes whose stream
    is synced, the approximate index for the others.

    With engine tokenizers configured, the precise half is asked with the engine's own
    hashes of the request (``RouteRequest.engine_block_hashes``): one signal per request.
    """

    def __init__(
        self,
        precise: PreciseIndex,
        approximate: CacheSignal,
        pending_s: float = PENDING_S,
        engine_block_hashes: Sequence[int] | None = None,
    ) -> None:
        self.precise = precise
        self.approximate = approximate
        self.pending_s = pending_s
        self.engine_block_hashes = engine_block_hashes

    def match(
        self,
        block_hashes: Sequence[int],
        now: float,
        nodes: Iterable[str] | None = None,
        max_age_s: float | None = None,
    ) -> dict[str, int]:
        """``CacheSignal.match``; ``max_age_s`` is not used: events say what is cached now,
        and the approximate half keeps its own TTL."""
        synced = self.precise.synced_nodes()
        wanted = None if nodes is None else set(nodes)
        exact = synced if wanted is None else synced & wanted
        engine = self.engine_block_hashes
        result = self.precise.match(
            engine if engine is not None else block_hashes, now, exact
        ) if exact else {}  # fmt: skip
        if exact and self.pending_s > 0:
            # prefixes dispatched to a synced node whose events have not arrived yet
            pending = self.approximate.match(block_hashes, now, exact, self.pending_s)
            for node, n in pending.items():
                if n > result.get(node, 0):
                    result[node] = n
        rest = None if wanted is None else wanted - exact
        if rest is None or rest:
            for node, n in self.approximate.match(block_hashes, now, rest).items():
                if node not in exact:
                    result[node] = n
        return result
