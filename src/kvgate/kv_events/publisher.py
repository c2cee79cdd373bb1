"""The publishing end (engine-sim): vLLM's PUB + ROUTER-replay protocol over ZMQ.

Each ``publish`` sends ``[topic, seq, payload]`` on the PUB socket with ``seq`` counting
from 0, and keeps the payload in a bounded replay buffer. A subscriber that missed
batches sends ``[b"", start_seq]`` from a DEALER to the ROUTER socket and gets every
buffered batch from ``start_seq`` on, then the end marker (see ``wire``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence

import zmq
import zmq.asyncio

from kvgate.kv_events.wire import END_SEQ, KVEvent, KVEventBatch, encode_batch, seq_to_bytes
from kvgate.tasks import cancel_and_wait

log = logging.getLogger(__name__)


def offset_endpoint(endpoint: str, offset: int) -> str:
    """``tcp://host:5557`` + 2 → ``tcp://host:5559`` (one publisher per engine, as vLLM
    offsets its data-parallel ranks); port 0 (any free port) stays 0."""
    if offset == 0:
        return endpoint
    if endpoint.startswith("tcp://"):
        base, _, port = endpoint.rpartition(":")
        if port.isdigit() and int(port) != 0:
            return f"{base}:{int(port) + offset}"
        return endpoint
    return f"{endpoint}_{offset}"


class KvEventPublisher:
    def __init__(
        self,
        endpoint: str,
        *,
        replay_endpoint: str | None = None,
        topic: str = "",
        buffer_steps: int = 10_000,
        data_parallel_rank: int = 0,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if buffer_steps < 1:
            raise ValueError("buffer_steps must be >= 1")
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic.encode()
        self.rank = data_parallel_rank
        self._wall = wall_clock
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = 0
        self._sync_ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._async_ctx: zmq.asyncio.Context | None = None
        self._pub: zmq.Socket[bytes] | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        self.bound_endpoint: str | None = None
        self.bound_replay_endpoint: str | None = None

    @property
    def next_seq(self) -> int:
        return self._seq

    async def start(self) -> None:
        self._sync_ctx = zmq.Context()
        pub = self._sync_ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, 100_000)
        pub.bind(self.endpoint)
        self._pub = pub
        self.bound_endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
        if self.replay_endpoint:
            self._async_ctx = zmq.asyncio.Context()
            router = self._async_ctx.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            router.bind(self.replay_endpoint)
            self._router = router
            self.bound_replay_endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
            self._task = asyncio.create_task(self._serve_replay())

    def publish(self, events: Sequence[KVEvent]) -> int:
        """Send one batch now; returns its sequence number."""
        seq = self._seq
        self._seq += 1
        payload = encode_batch(KVEventBatch(self._wall(), list(events), self.rank))
        self._buffer.append((seq, payload))
        if self._pub is not None:
            # PUB never blocks: past the high-water mark ZMQ drops, and the subscriber
            # sees a gap it fills from the replay buffer.
            self._pub.send_multipart((self.topic, seq_to_bytes(seq), payload))
        return seq

    async def _serve_replay(self) -> None:
        router = self._router
        assert router is not None
        while True:
            frames = await router.recv_multipart()
            if len(frames) != 3:
                log.warning(
                    "kv events: ignoring a malformed replay request (%d frames)", len(frames)
                )
                continue
            ident, _, start_raw = frames
            start = int.from_bytes(start_raw, "big")
            for seq, payload in list(self._buffer):
                if seq >= start:
                    await router.send_multipart((ident, b"", seq_to_bytes(seq), payload))
            await router.send_multipart((ident, b"", END_SEQ, b""))

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        for sock in (self._pub, self._router):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._router = None
        for ctx in (self._sync_ctx, self._async_ctx):
            if ctx is not None:
                ctx.term()
        self._sync_ctx = self._async_ctx = None
