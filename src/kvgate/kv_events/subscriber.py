"""The subscribing end (gateway): one SUB socket per engine, gap replay, restart resync.

Per message ``[topic, seq, payload]``:

* first message since start or resync: when ``seq > 0`` the earlier batches are asked for
  on the replay socket (a gateway joining a running engine); what the buffer no longer
  holds is lost, and the node's state is complete only from then on;
* ``seq`` lower than expected: the publisher restarted (its counter began again) — the
  node's entries are dropped (resync) and rebuilt from the new stream;
* ``seq`` higher than expected: a gap — the missing batches are replayed; if the replay
  cannot fill it, the node is resynced (dropped, unsynced: routing falls back to the
  approximate index for it) and counts as synced again from the next batch on.

Lag is measured as wall time at apply minus the batch's ``ts`` (the engine's wall clock).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable

import zmq
import zmq.asyncio

from kvgate.kv_events import wire
from kvgate.kv_events.index import PreciseIndex
from kvgate.kv_events.metrics import KvEventMetrics
from kvgate.kv_events.rehash import TokenRehasher
from kvgate.tasks import cancel_and_wait

log = logging.getLogger(__name__)
_RECENT = 4096  # applied (seq → payload hash) kept to tell duplicates from restarts


class KvEventSubscriber:
    def __init__(
        self,
        node_id: str,
        endpoint: str,
        *,
        index: PreciseIndex,
        metrics: KvEventMetrics,
        context: zmq.asyncio.Context,
        replay_endpoint: str | None = None,
        topic: str = "",
        now: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        replay_timeout_s: float = 2.0,
        lag_samples: int = 10_000,
        rehasher: TokenRehasher | None = None,
    ) -> None:
        self.node_id = node_id
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic.encode()
        self.index = index
        self.metrics = metrics
        self._ctx = context
        self._now = now
        self._wall = wall_clock
        self.replay_timeout_s = replay_timeout_s
        self.rehasher = rehasher  # re-key events by their token ids (engine type sglang)
        self.next_seq: int | None = None  # None: nothing applied since start or resync
        self.lags: deque[float] = deque(maxlen=lag_samples)
        self.applied = 0
        self._recent: OrderedDict[int, int] = OrderedDict()
        self._task: asyncio.Task[None] | None = None
        self._sub: zmq.asyncio.Socket | None = None

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 100_000)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        sub.connect(self.endpoint)
        self._sub = sub
        self._task = asyncio.create_task(self._run(), name=f"kv-events-{self.node_id}")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        if self._sub is not None:
            self._sub.close(linger=0)
            self._sub = None

    def resync(self, reason: str) -> None:
        """Drop the node's precise state; it is rebuilt from the next batches."""
        self.index.resync(self.node_id)
        if self.rehasher is not None:
            self.rehasher.reset()
        self.next_seq = None
        self._recent.clear()
        self.metrics.resyncs.labels(self.node_id, reason).inc()
        self.metrics.synced.labels(self.node_id).set(0)
        self.metrics.blocks.labels(self.node_id).set(0)

    # -- receive loop ------------------------------------------------------------------
    async def _run(self) -> None:
        assert self._sub is not None
        sub = self._sub
        if self.replay_endpoint:
            try:
                await self.initial_sync()
            except Exception:
                log.exception("kv events from %s: initial replay failed", self.node_id)
        while True:
            frames = await sub.recv_multipart()
            try:
                await self.handle(frames)
            except Exception:  # one bad message must not stop the stream
                log.exception("kv events from %s: message handling failed", self.node_id)

    async def initial_sync(self) -> None:
        """Catch up from the replay buffer at start, before any live message: an idle
        engine's state is known at once. An empty buffer means nothing was published yet:
        the engine's cache is empty and the node is synced."""
        _complete, outcome, count = await self._replay(0, None, first=True)
        if outcome == "ended" and count == 0 and self.next_seq is None:
            self.index.apply(self.node_id, wire.KVEventBatch(self._wall(), []), self._now())
            self.metrics.synced.labels(self.node_id).set(1)

    async def handle(self, frames: list[bytes]) -> None:
        if len(frames) != 3:
            self.metrics.decode_errors.labels(self.node_id).inc()
            return
        _topic, seq_raw, payload = frames
        try:
            seq = wire.seq_from_bytes(seq_raw)
        except wire.WireError:
            self.metrics.decode_errors.labels(self.node_id).inc()
            return
        expected = self.next_seq
        if expected is not None and seq < expected:
            if self._recent.get(seq) == hash(payload):
                return  # already applied (it also came through a replay)
            self.resync("restart")
            expected = None
        if expected is None:
            if seq > 0 and self.replay_endpoint:
                await self._replay(0, seq, first=True)
        elif seq > expected:
            self.metrics.gaps.labels(self.node_id).inc()
            filled = False
            if self.replay_endpoint is not None:
                # Ask from the last applied batch too: if the publisher's copy of it differs
                # from ours, this is a restarted publisher whose counter passed ours.
                filled, outcome, _ = await self._replay(expected - 1, seq, verify=expected - 1)
                if outcome == "restarted":
                    self.resync("restart")
                    await self._replay(0, seq, first=True)
                    filled = True
            if not filled:
                self.resync("gap")
        if self.next_seq is not None and seq < self.next_seq:
            return  # already applied from the replay
        self._apply(seq, payload)

    def _apply(self, seq: int, payload: bytes) -> None:
        try:
            batch = wire.decode_batch(payload, token_ids=self.rehasher is not None)
        except wire.WireError as exc:
            log.warning("kv events from %s: bad batch %d: %s", self.node_id, seq, exc)
            self.metrics.decode_errors.labels(self.node_id).inc()
            self.resync("decode_error")
            return
        if self.rehasher is not None:
            batch = self.rehasher.translate(batch)
        self.index.apply(self.node_id, batch, self._now(), seq)
        self.next_seq = seq + 1
        recent = self._recent
        recent[seq] = hash(payload)
        if len(recent) > _RECENT:
            recent.popitem(last=False)
        self.applied += 1
        lag = max(0.0, self._wall() - batch.ts)
        self.lags.append(lag)
        m, node = self.metrics, self.node_id
        m.lag.labels(node).observe(lag)
        m.batches.labels(node).inc()
        for ev in batch.events:
            kind = (
                "stored"
                if isinstance(ev, wire.BlockStored)
                else "removed"
                if isinstance(ev, wire.BlockRemoved)
                else "cleared"
                if isinstance(ev, wire.AllBlocksCleared)
                else "other"
            )
            m.events.labels(node, kind).inc()
        m.synced.labels(node).set(1)
        m.blocks.labels(node).set(self.index.state(node).blocks)

    async def _replay(
        self, start: int, until: int | None, *, first: bool = False, verify: int | None = None
    ) -> tuple[bool, str, int]:
        """Apply buffered batches ``start <= seq < until`` (``until`` None: all of them);
        returns (all of them came, outcome, batches received). ``verify``: a sequence
        number already applied; if the publisher's batch for it differs from ours, nothing
        is applied and the outcome is "restarted"."""
        assert self.replay_endpoint is not None
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        got: list[tuple[int, bytes]] = []
        outcome = "timeout"
        try:
            dealer.connect(self.replay_endpoint)
            await dealer.send_multipart((b"", wire.seq_to_bytes(start)))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.replay_timeout_s
            while True:
                left = deadline - loop.time()
                if left <= 0 or not await dealer.poll(left * 1000):
                    break
                frames = await dealer.recv_multipart()
                # [b"", seq, payload] (vLLM <= 0.11, engine-sim) or [b"", topic, seq,
                # payload] (vLLM 0.32 sends the topic too)
                if len(frames) not in (3, 4):
                    continue
                seq = wire.seq_from_bytes(frames[-2])
                if seq < 0:
                    outcome = "ended"
                    break
                if start <= seq and (until is None or seq < until):
                    got.append((seq, frames[-1]))
        finally:
            dealer.close(linger=0)
        got.sort()
        if verify is not None:
            mine = self._recent.get(verify)
            theirs = next((p for s, p in got if s == verify), None)
            if mine is not None and theirs is not None and hash(theirs) != mine:
                self.metrics.replays.labels(self.node_id, "restarted").inc()
                return False, "restarted", len(got)
            got = [(s, p) for s, p in got if s != verify]
            start = verify + 1
        seqs = [s for s, _ in got]
        end = until if until is not None else (seqs[-1] + 1 if seqs else start)
        complete = seqs == list(range(start, end)) and (until is not None or outcome == "ended")
        if first and got and not complete and (until is not None or outcome == "ended"):
            # Joining late: apply what the buffer still holds, in order from its start.
            first_seq = got[0][0]
            if seqs == list(range(first_seq, end)):
                complete = True  # complete from first_seq on; earlier history is gone
                outcome = "partial"
        if complete:
            for seq, payload in got:
                if self.next_seq is None or seq >= self.next_seq:
                    self._apply(seq, payload)
        if complete:
            label = "partial" if outcome == "partial" else "filled"
        else:
            label = "short" if outcome == "ended" else "timeout"
        self.metrics.replays.labels(self.node_id, label).inc()
        return complete, outcome, len(got)
