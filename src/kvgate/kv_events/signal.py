"""Binds a precise index to one router's node view, for policy ``precise`` to find.

The routing context a policy sees carries the node view but (today) no second cache
signal, so the event index is looked up by the node view it serves: each gateway replica
and each simulated cluster has its own node view, hence its own index. Weakly keyed, so a
discarded router takes its binding with it.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from kvgate.kv_events.index import PreciseIndex
from kvgate.kv_events.metrics import KvEventMetrics


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
