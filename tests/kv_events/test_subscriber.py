"""Sequence handling against a real publisher's replay socket: gaps, restarts, late joins."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import zmq.asyncio

from kvgate.kv_events.index import PreciseIndex
from kvgate.kv_events.metrics import KvEventMetrics
from kvgate.kv_events.publisher import KvEventPublisher
from kvgate.kv_events.subscriber import KvEventSubscriber
from kvgate.kv_events.wire import BlockStored, seq_to_bytes


@pytest.fixture
async def ctx() -> AsyncIterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    context.term()


async def _publisher(buffer_steps: int = 100) -> KvEventPublisher:
    pub = KvEventPublisher(
        "tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0", buffer_steps=buffer_steps
    )
    await pub.start()
    return pub


def _subscriber(pub: KvEventPublisher, ctx: zmq.asyncio.Context) -> KvEventSubscriber:
    assert pub.bound_endpoint and pub.bound_replay_endpoint
    return KvEventSubscriber(
        "n",
        pub.bound_endpoint,
        index=PreciseIndex(),
        metrics=KvEventMetrics(),
        context=ctx,
        replay_endpoint=pub.bound_replay_endpoint,
        replay_timeout_s=2.0,
    )


def _frames(pub: KvEventPublisher, seq: int) -> list[bytes]:
    payload = dict(pub._buffer)[seq]
    return [b"", seq_to_bytes(seq), payload]


async def _heard_a_publisher_that_stopped(ctx: zmq.asyncio.Context) -> KvEventSubscriber:
    """A subscriber that applied batches 0..2 (blocks 0, 1, 2) of a publisher now gone."""
    old = await _publisher()
    sub = _subscriber(old, ctx)
    try:
        for i in range(3):
            old.publish([BlockStored([i], None)])
            await sub.handle(_frames(old, i))
    finally:
        await old.stop()
    return sub


def _value(sub: KvEventSubscriber, name: str, **labels: str) -> float:
    v = sub.metrics.registry.get_sample_value(name, {"node": "n", **labels})
    return v or 0.0


async def test_a_gap_is_filled_from_the_replay_socket(ctx: zmq.asyncio.Context) -> None:
    pub = await _publisher()
    try:
        for i in range(5):
            pub.publish([BlockStored([100 + i], 99 + i if i else None)])
        sub = _subscriber(pub, ctx)
        await sub.handle(_frames(pub, 0))
        await sub.handle(_frames(pub, 1))
        await sub.handle(_frames(pub, 4))  # 2 and 3 were lost on the PUB socket
        assert sub.index.blocks_of("n") == {100, 101, 102, 103, 104}
        assert sub.index.match([100, 101, 102, 103, 104], 0.0) == {"n": 5}
        assert sub.next_seq == 5
        assert _value(sub, "kvgate_kv_events_gaps_total") == 1
        assert _value(sub, "kvgate_kv_events_replays_total", outcome="filled") == 1
        assert _value(sub, "kvgate_kv_events_resyncs_total", reason="gap") == 0
        # The SUB socket delivering a batch the replay already applied is a duplicate,
        # not a publisher restart.
        await sub.handle(_frames(pub, 3))
        assert _value(sub, "kvgate_kv_events_resyncs_total", reason="restart") == 0
        assert sub.index.blocks_of("n") == {100, 101, 102, 103, 104} and sub.next_seq == 5
    finally:
        await pub.stop()


async def test_a_publisher_restart_drops_the_old_state(ctx: zmq.asyncio.Context) -> None:
    sub = await _heard_a_publisher_that_stopped(ctx)
    assert sub.index.blocks_of("n") == {0, 1, 2}
    new = await _publisher()
    try:
        sub.replay_endpoint = new.bound_replay_endpoint
        new.publish([BlockStored([50], None)])
        await sub.handle(_frames(new, 0))
        assert sub.index.blocks_of("n") == {50}  # the restarted engine's cache is empty + 50
        assert _value(sub, "kvgate_kv_events_resyncs_total", reason="restart") == 1
        assert sub.index.is_synced("n")
    finally:
        await new.stop()


async def test_an_unfillable_gap_resyncs_and_recovers(ctx: zmq.asyncio.Context) -> None:
    pub = await _publisher(buffer_steps=2)  # the replay buffer forgets quickly
    try:
        sub = _subscriber(pub, ctx)
        frames = []
        for i in range(6):
            pub.publish([BlockStored([10 + i], None)])
            frames.append(_frames(pub, i))
        await sub.handle(frames[0])
        assert sub.index.blocks_of("n") == {10}
        await sub.handle(frames[5])  # 1..4 lost; the buffer holds only 4 and 5
        assert _value(sub, "kvgate_kv_events_gaps_total") == 1
        assert _value(sub, "kvgate_kv_events_replays_total", outcome="short") == 1
        assert _value(sub, "kvgate_kv_events_resyncs_total", reason="gap") == 1
        # Nothing stale is kept; the node is synced again from batch 5 on.
        assert sub.index.blocks_of("n") == {15}
        assert sub.index.is_synced("n") and sub.next_seq == 6
    finally:
        await pub.stop()


async def test_a_late_joiner_replays_from_the_start(ctx: zmq.asyncio.Context) -> None:
    pub = await _publisher()
    try:
        for i in range(4):
            pub.publish([BlockStored([i], None)])
        sub = _subscriber(pub, ctx)
        await sub.handle(_frames(pub, 3))  # first message seen: seq 3
        assert sub.index.blocks_of("n") == {0, 1, 2, 3}
        assert _value(sub, "kvgate_kv_events_replays_total", outcome="filled") == 1
        assert _value(sub, "kvgate_kv_events_gaps_total") == 0
    finally:
        await pub.stop()


async def test_live_stream_over_the_sub_socket(ctx: zmq.asyncio.Context) -> None:
    import asyncio

    pub = await _publisher()
    sub = _subscriber(pub, ctx)
    sub.start()
    try:
        await asyncio.sleep(0.2)  # PUB/SUB: let the subscription propagate
        for i in range(20):
            pub.publish([BlockStored([i], i - 1 if i else None)])
        for _ in range(100):
            if sub.next_seq == 20:
                break
            await asyncio.sleep(0.02)
        assert sub.index.match(list(range(20)), 0.0) == {"n": 20}
        assert len(sub.lags) == 20 and max(sub.lags) < 5.0
    finally:
        await sub.stop()
        await pub.stop()


async def test_start_catches_up_from_the_replay_buffer(ctx: zmq.asyncio.Context) -> None:
    import asyncio

    idle = await _publisher()
    busy = await _publisher()
    try:
        for i in range(3):
            busy.publish([BlockStored([i], i - 1 if i else None)])
        subs = [_subscriber(p, ctx) for p in (idle, busy)]
        for sub in subs:
            sub.start()
        for _ in range(100):
            if all(s.index.is_synced("n") for s in subs):
                break
            await asyncio.sleep(0.02)
        # No live message was sent after the subscribers started: both know their engine.
        assert subs[0].index.is_synced("n") and subs[0].index.blocks_of("n") == frozenset()
        assert subs[1].index.match([0, 1, 2], 0.0) == {"n": 3} and subs[1].next_seq == 3
        for sub in subs:
            await sub.stop()
    finally:
        await idle.stop()
        await busy.stop()


async def test_a_restart_whose_counter_overtook_ours_is_not_taken_for_a_gap(
    ctx: zmq.asyncio.Context,
) -> None:
    sub = await _heard_a_publisher_that_stopped(ctx)
    new = await _publisher()  # restarted: published 0..5 before we heard any of it
    try:
        sub.replay_endpoint = new.bound_replay_endpoint
        for i in range(6):
            new.publish([BlockStored([100 + i], None)])
        await sub.handle(_frames(new, 5))  # looks like a gap 3..4 at first sight
        assert sub.index.blocks_of("n") == {100, 101, 102, 103, 104, 105}
        assert _value(sub, "kvgate_kv_events_resyncs_total", reason="restart") == 1
        assert _value(sub, "kvgate_kv_events_resyncs_total", reason="gap") == 0
        assert sub.next_seq == 6
    finally:
        await new.stop()
