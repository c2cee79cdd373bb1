"""KV cache events in virtual time: the simulated engines' events feed a precise index.

Each ``EngineCore``'s block pool records its cache events; ``deliver(now)`` collects them,
stamps them with the time they were collected and applies those older than ``delay_s`` to
the index, in order — the simulator's stand-in for the ZMQ stream's latency. A node that
(re)joins starts a fresh stream: its index entries are dropped (resync) and it counts as
synced once its first events arrive, exactly as the live subscriber treats a publisher
restart.
"""

from __future__ import annotations

from collections import deque

from kvgate.engine.core import EngineCore
from kvgate.kv_events.index import PreciseIndex
from kvgate.kv_events.metrics import KvEventMetrics
from kvgate.kv_events.signal import PreciseSignal, bind_signal
from kvgate.kv_events.wire import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, KVEventBatch


def drain_batch(engine: EngineCore, now: float) -> KVEventBatch:
    """The engine's cache events since the last drain, as the wire's event batch."""
    events: list[KVEvent] = []
    for kind, parent, hashes, _tokens in engine.scheduler.kv.pool.drain_events():
        if kind == "stored":
            events.append(BlockStored(hashes, parent))
        elif kind == "removed":
            events.append(BlockRemoved(hashes))
        else:
            events.append(AllBlocksCleared())
    return KVEventBatch(now, events)


class KvEventFeed:
    def __init__(self, node_view: object, *, delay_s: float = 0.0, block_size: int = 16) -> None:
        if delay_s < 0:
            raise ValueError("kv event delay must be >= 0")
        self.delay_s = delay_s
        self.index = PreciseIndex()
        self.metrics = KvEventMetrics()
        self.signal = PreciseSignal(self.index, self.metrics, block_size)
        bind_signal(node_view, self.signal)
        self._engines: dict[str, EngineCore] = {}
        self._queue: deque[tuple[float, str, KVEventBatch]] = deque()
        self.batches = 0

    def attach(self, node_id: str, engine: EngineCore) -> None:
        """A node (re)started with this engine: its old stream and entries are gone."""
        self._engines[node_id] = engine
        engine.scheduler.kv.enable_events()
        self._queue = deque(item for item in self._queue if item[1] != node_id)
        self.index.resync(node_id)
        # An empty engine's stream is complete from its first event: synced at once.
        self.index.apply(node_id, KVEventBatch(engine.now, []), engine.now)

    def collect(self, now: float) -> None:
        for node_id, engine in self._engines.items():
            batch = drain_batch(engine, now)
            if batch.events:
                self._queue.append((now, node_id, batch))

    def deliver(self, now: float) -> None:
        """Collect new events and apply every batch at least ``delay_s`` old."""
        self.collect(now)
        queue, cutoff = self._queue, now - self.delay_s
        while queue and queue[0][0] <= cutoff:
            _, node_id, batch = queue.popleft()
            if node_id in self._engines:
                self.index.apply(node_id, batch, now)
                self.batches += 1


def feed_for(policy: str, node_view: object, delay_s: float) -> KvEventFeed | None:
    """The event feed a simulated cluster needs: only policies that read engine events."""
    return KvEventFeed(node_view, delay_s=delay_s) if policy == "precise" else None
