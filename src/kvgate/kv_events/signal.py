"""Binds a precise index to one router's node view, for policy ``precise`` to find.

The routing context a policy sees carries the node view but (today) no second cache
signal, so the event index is looked up by the node view it serves: each gateway replica
and each simulated cluster has its own node view, hence its own index. Weakly keyed, so a
discarded router takes its binding with it.

Expected cached tokens on a synced node are counted in the engine's own units: the blocks
of the request's engine hashes (at that node's KV block size) its events say are cached,
times the block size, short of the block holding the prompt's last token, which the engine
always recomputes (``engine_cached_tokens``).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvgate.kv_events.hashing import engine_cached_tokens
from kvgate.kv_events.index import PreciseIndex
from kvgate.kv_events.metrics import KvEventMetrics
from kvgate.tokens import BLOCK_SIZE
from kvgate.types import RouteRequest

if TYPE_CHECKING:  # a runtime import would circle back through kvgate.routing's policies
    from kvgate.routing.cache_signal import CacheSignal

# How long the gateway's own dispatch of a prefix to a synced node stands in for the
# engine's event: blocks just sent are not cached yet (prefill runs, events travel), but
# a request routed now will find them there. Above the live event lag p99 seen (< 0.3 s).
PENDING_S = 1.0


class PendingBlocks:
    """Per node, the engine block hashes just dispatched there, until ``PENDING_S`` after."""

    def __init__(self, pending_s: float = PENDING_S) -> None:
        self.pending_s = pending_s
        self._nodes: dict[str, dict[int, float]] = {}

    def record(self, node_id: str, hashes: Sequence[int], now: float) -> None:
        held = self._nodes.setdefault(node_id, {})
        if len(held) > 4096:
            for h in [h for h, until in held.items() if until < now]:
                del held[h]
        until = now + self.pending_s
        for h in hashes:
            held[h] = until

    def match(self, hashes: Sequence[int], node_id: str, now: float) -> int:
        held = self._nodes.get(node_id)
        if not held:
            return 0
        n = 0
        for h in hashes:
            until = held.get(h)
            if until is None or until < now:
                break
            n += 1
        return n

    def forget(self, node_id: str) -> None:
        self._nodes.pop(node_id, None)


@dataclass(slots=True)
class PreciseSignal:
    index: PreciseIndex
    metrics: KvEventMetrics
    # the block size of a node whose own is not known (no cache_config_info, no event yet)
    block_size: int = 16
    # the configured kv_events.block_size: every node's, whatever it reports
    override: int | None = None
    block_sizes: dict[str, int] = field(default_factory=dict)  # learned per node
    pending: PendingBlocks = field(default_factory=PendingBlocks)

    def block_size_of(self, node_id: str) -> int:
        """The node's KV block size: the configured override, else what its metrics
        (cache_config_info) said, else what its events carry, else the default."""
        if self.override is not None:
            return self.override
        learned = self.learned_block_size(node_id)
        return learned if learned is not None else self.block_size

    def learned_block_size(self, node_id: str) -> int | None:
        reported = self.block_sizes.get(node_id)
        if reported is not None:
            return reported
        st = self.index.states.get(node_id)
        return st.block_size if st is not None and st.block_size else None


_BOUND: weakref.WeakKeyDictionary[object, PreciseSignal] = weakref.WeakKeyDictionary()


def bind_signal(node_view: object, signal: PreciseSignal) -> None:
    _BOUND[node_view] = signal


def unbind_signal(node_view: object) -> None:
    _BOUND.pop(node_view, None)


def signal_for(node_view: object) -> PreciseSignal | None:
    return _BOUND.get(node_view)


class CombinedSignal:
    """A router cache signal (``CacheSignal``): the engines' events for nodes whose stream
    is synced, the approximate index for the others.

    ``match`` answers in blocks (``PrefixIndex.match``'s shape); ``match_tokens`` answers
    in expected cached tokens and is what policies read when it is there: with engine
    hashes on the request (``RouteRequest.engine_block_hashes``, per block size), a synced
    node's figure is in the engine's tokens at that node's block size (``PreciseSignal``),
    the rest in kvgate's text-model tokens.
    """

    def __init__(
        self,
        precise: PreciseIndex,
        approximate: CacheSignal,
        pending_s: float = PENDING_S,
        engine_block_hashes: Sequence[int] | None = None,
        *,
        bound: PreciseSignal | None = None,
    ) -> None:
        self.precise = precise
        self.approximate = approximate
        self.pending_s = pending_s
        self.engine_block_hashes = engine_block_hashes
        self.bound = bound

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

    def match_tokens(
        self, req: RouteRequest, now: float, nodes: Iterable[str] | None = None
    ) -> dict[str, int]:
        """Per node, the prompt tokens its engine is expected to find cached (> 0 only)."""
        bound = self.bound
        engine = req.engine_block_hashes
        engine_tokens = req.engine_prompt_tokens
        wanted = None if nodes is None else set(nodes)
        if bound is None or engine is None or engine_tokens is None:
            blocks = self.match(req.block_hashes, now, wanted)
            return _kvgate_tokens(blocks, req.prompt_tokens)
        synced = self.precise.synced_nodes()
        exact = synced if wanted is None else synced & wanted
        groups: dict[int, list[str]] = {}
        for node in exact:
            bs = bound.block_size_of(node)
            if bs in engine:  # else hashed elsewhere without this node's size: approximate
                groups.setdefault(bs, []).append(node)
        result: dict[str, int] = {}
        for bs, group in groups.items():
            hashes = engine[bs]
            held = self.precise.match(hashes, now, group)
            for node in group:
                n = max(held.get(node, 0), bound.pending.match(hashes, node, now))
                tokens = engine_cached_tokens(n, engine_tokens, bs)
                if tokens > 0:
                    result[node] = tokens
        done = {n for g in groups.values() for n in g}
        if wanted is None:
            blocks = self.approximate.match(req.block_hashes, now, None)
            blocks = {n: b for n, b in blocks.items() if n not in done}
        else:
            rest = wanted - done
            blocks = self.approximate.match(req.block_hashes, now, rest) if rest else {}
        result.update(_kvgate_tokens(blocks, req.prompt_tokens))
        return result


def _kvgate_tokens(blocks: dict[str, int], prompt_tokens: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for node, n in blocks.items():
        tokens = engine_cached_tokens(n, prompt_tokens, BLOCK_SIZE)
        if tokens > 0:
            out[node] = tokens
    return out
