"""The precise index: per node, the block hashes its engine says are cached.

Built only from KV cache events (``apply``), never from where the gateway sent work, so
every gateway replica that reads the same event streams holds the same index. Plain,
clock-free and synchronous: the live subscriber and the simulator's event feed drive it.

A node is *synced* while its stream is known to be complete from some point on (events
flow, no unfilled gap since the last resync). ``match`` answers only for synced nodes;
routing falls back to the approximate index for the others (``synced_nodes``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvgate.kv_events.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventBatch,
)

# Media whose blocks a request can hit in the engine's prefix cache. vLLM marks offloaded
# copies (e.g. "CPU") with other media; those are not on-device hits.
DEVICE_MEDIA = frozenset({None, "GPU", "gpu"})


@dataclass(slots=True)
class NodeEventState:
    synced: bool = False
    last_seq: int | None = None
    last_event_ts: float | None = None  # engine-side timestamp of the last batch
    last_applied_at: float | None = None  # our clock when we applied it
    blocks: int = 0
    batches: int = 0
    block_size: int | None = None  # tokens per block, as the node's BlockStored events say


class PreciseIndex:
    def __init__(self) -> None:
        # block hash → the node holding it, or a set when several do. Most blocks sit on
        # one node; a plain str is not tracked by the cyclic GC (a set per block made
        # inserting a million blocks ~3× slower).
        self._holders: dict[int, str | set[str]] = {}
        self._by_node: dict[str, set[int]] = {}
        self.states: dict[str, NodeEventState] = {}

    # -- state -------------------------------------------------------------------------
    def state(self, node_id: str) -> NodeEventState:
        st = self.states.get(node_id)
        if st is None:
            st = self.states[node_id] = NodeEventState()
        return st

    def is_synced(self, node_id: str) -> bool:
        st = self.states.get(node_id)
        return st is not None and st.synced

    def synced_nodes(self) -> frozenset[str]:
        return frozenset(n for n, st in self.states.items() if st.synced)

    def blocks_of(self, node_id: str) -> frozenset[int]:
        return frozenset(self._by_node.get(node_id, ()))

    def __len__(self) -> int:
        return sum(len(s) for s in self._by_node.values())

    # -- updates -----------------------------------------------------------------------
    def apply(self, node_id: str, batch: KVEventBatch, now: float, seq: int | None = None) -> None:
        """Apply one batch in stream order; the node counts as synced from now on."""
        for ev in batch.events:
            self.apply_event(node_id, ev)
        st = self.state(node_id)
        st.synced = True
        st.batches += 1
        st.last_event_ts = batch.ts
        st.last_applied_at = now
        if seq is not None:
            st.last_seq = seq
        st.blocks = len(self._by_node.get(node_id, ()))

    def apply_event(self, node_id: str, ev: KVEvent) -> None:
        if isinstance(ev, BlockStored):
            if ev.medium not in DEVICE_MEDIA:
                return
            if ev.block_size > 0:
                self.state(node_id).block_size = ev.block_size
            held = self._by_node.setdefault(node_id, set())
            holders = self._holders
            for h in ev.block_hashes:
                if h not in held:
                    held.add(h)
                    nodes = holders.get(h)
                    if nodes is None:
                        holders[h] = node_id
                    elif type(nodes) is str:
                        holders[h] = {nodes, node_id}
                    else:
                        nodes.add(node_id)  # type: ignore[union-attr]
        elif isinstance(ev, BlockRemoved):
            if ev.medium not in DEVICE_MEDIA:
                return
            self._remove(node_id, ev.block_hashes)
        elif isinstance(ev, AllBlocksCleared):
            self._clear(node_id)

    def _remove(self, node_id: str, hashes: Iterable[int]) -> None:
        held = self._by_node.get(node_id)
        if not held:
            return
        for h in hashes:
            if h in held:
                held.discard(h)
                self._unhold(h, node_id)

    def _clear(self, node_id: str) -> None:
        held = self._by_node.pop(node_id, None)
        if held:
            self._remove_all(node_id, held)

    def _remove_all(self, node_id: str, held: set[int]) -> None:
        for h in held:
            self._unhold(h, node_id)

    def _unhold(self, h: int, node_id: str) -> None:
        holders = self._holders
        nodes = holders.get(h)
        if nodes is None:
            return
        if type(nodes) is str:
            if nodes == node_id:
                del holders[h]
            return
        nodes.discard(node_id)  # type: ignore[union-attr]
        if len(nodes) == 1:
            holders[h] = next(iter(nodes))
        elif not nodes:
            del holders[h]

    def resync(self, node_id: str) -> int:
        """Forget a node's blocks and mark it unsynced (publisher restart, lost events);
        returns the blocks dropped."""
        held = self._by_node.pop(node_id, set())
        self._remove_all(node_id, held)
        st = self.state(node_id)
        st.synced = False
        st.last_seq = None
        st.blocks = 0
        return len(held)

    def forget(self, node_id: str) -> None:
        """The node left the cluster."""
        self.resync(node_id)
        self.states.pop(node_id, None)

    # -- queries -----------------------------------------------------------------------
    def match(
        self,
        block_hashes: Sequence[int],
        now: float,
        nodes: Iterable[str] | None = None,
        max_age_s: float | None = None,
    ) -> dict[str, int]:
        """``CacheSignal.match`` over the synced nodes. ``now`` and ``max_age_s`` are unused:
        events, not time, say what is cached. Like the engine's own prefix lookup, the walk
        stops at the first missing block."""
        if not block_hashes:
            return {}
        holders = self._holders
        first = holders.get(block_hashes[0])
        if not first:
            return {}
        states = self.states
        allowed = (
            None
            if nodes is None
            else (nodes if isinstance(nodes, (set, frozenset, dict)) else set(nodes))
        )
        alive = [
            n
            for n in ((first,) if type(first) is str else first)
            if (allowed is None or n in allowed) and (st := states.get(n)) is not None and st.synced
        ]
        result: dict[str, int] = {}
        i = 1
        n_blocks = len(block_hashes)
        while alive and i < n_blocks:
            nodes_i = holders.get(block_hashes[i])
            if not nodes_i:
                break
            if type(nodes_i) is str:
                still = [nodes_i] if nodes_i in alive else []
                for n in alive:
                    if n != nodes_i:
                        result[n] = i
            else:
                still = []
                for n in alive:
                    if n in nodes_i:
                        still.append(n)
                    else:
                        result[n] = i
            alive = still
            i += 1
        for n in alive:
            result[n] = i
        return result
