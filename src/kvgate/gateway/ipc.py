"""The local socket between a proxy worker and the decision owner (``serve --workers N``).

Frames: 4-byte length + pickle (both ends are this program, on one machine). Outgoing
frames are coalesced: everything sent during one event-loop turn leaves in one write.
A *call* carries a sequence number and waits for the owner's ``("ok"|"err", seq, …)``
answer; a *tell* is one-way. The owner also sends ``("config", GatewayConfig)`` on its
own: when a worker connects and whenever it starts running a new config version; and
``("metrics?", n)`` when it renders /metrics, which the worker answers with its
``("metrics", text, n)`` push. The owner applies each worker's tells and ordered calls in
the order sent, so an attempt's outcome always reaches the pipeline before the retry
decision or the release that follows it.
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvgate.gateway.errors import ApiError
from kvgate.pipeline import GiveUp
from kvgate.types import AdmissionResult, RouteDecision

_LEN = struct.Struct("!I")


class FrameProtocol(asyncio.Protocol):
    """Length-prefixed pickled frames; outgoing frames are flushed once per loop turn."""

    def __init__(self, on_frame: Callable[[Any], None], on_lost: Callable[[], None]) -> None:
        self.on_frame = on_frame
        self.on_lost = on_lost
        self.transport: asyncio.Transport | None = None
        self._buf = b""
        self._out: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.on_lost()

    def data_received(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        pos, n = 0, len(buf)
        while n - pos >= 4:
            (size,) = _LEN.unpack_from(buf, pos)
            if n - pos - 4 < size:
                break
            frame = pickle.loads(buf[pos + 4 : pos + 4 + size])
            pos += 4 + size
            self.on_frame(frame)
        self._buf = buf[pos:]

    def send(self, message: Any, *, now: bool = False) -> None:
        """Queue a frame for this loop turn's write; ``now`` writes it (and the queue) at once."""
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        if not self._out and not now:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.append(_LEN.pack(len(data)) + data)
        if now:
            self._flush()

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self.transport is not None and out:
            self.transport.write(b"".join(out))


# -- what crosses the socket -------------------------------------------------------------
@dataclass(slots=True)
class Attempt:
    """The owner's routing of one attempt: a decision (and its node's URL) or a give-up."""

    decision: RouteDecision | None
    url: str | None = None
    give_up: tuple[int, str, str, float | None] | None = None  # GiveUp's fields
    traceparent: str | None = None  # the attempt's span (sent to the engine), when traced

    def raise_give_up(self) -> None:
        if self.give_up is not None:
            status, code, message, retry_after_s = self.give_up
            raise GiveUp(status, code, message, retry_after_s=retry_after_s)


def give_up_fields(stop: GiveUp) -> tuple[int, str, str, float | None]:
    return (stop.status, stop.code, str(stop), stop.retry_after_s)


@dataclass(slots=True)
class Admitted:
    """The owner's answer to ``admit``: the admission result (its ticket stays with the
    owner), whether the request runs as a job, and the first attempt's routing when the
    request goes upstream at once (one round trip for admit + route)."""

    result: AdmissionResult
    run_async: bool
    first: Attempt | None = None


def error_tuple(exc: ApiError) -> tuple[Any, ...]:
    return (exc.status, exc.message, exc.type_, exc.param, exc.code, exc.headers)


def error_from(t: tuple[Any, ...]) -> ApiError:
    status, message, type_, param, code, headers = t
    return ApiError(status, message, type_=type_, param=param, code=code, headers=headers)


class DecisionClient:
    """A worker's connection to the owner."""

    def __init__(
        self,
        on_lost: Callable[[], None] | None = None,
        on_config: Callable[[Any], None] | None = None,
        on_metrics_wanted: Callable[[int], None] | None = None,
    ) -> None:
        self.on_lost = on_lost
        self.on_config = on_config  # the owner's config, at connect and on each reload
        self.on_metrics_wanted = on_metrics_wanted  # the owner renders /metrics: push now
        self._proto: FrameProtocol | None = None
        self._waiters: dict[int, asyncio.Future[Any]] = {}
        self._seq = 0

    async def connect(self, path: str) -> None:
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_unix_connection(
            lambda: FrameProtocol(self._frame, self._lost), path
        )
        self._proto = proto

    def _lost(self) -> None:
        self._proto = None
        if self.on_lost is not None:
            self.on_lost()
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_exception(
                    ApiError(503, "decision owner unavailable", code="owner_unavailable")
                )
        self._waiters.clear()

    def _frame(self, frame: Any) -> None:
        if frame[0] == "config":
            if self.on_config is not None:
                self.on_config(frame[1])
            return
        if frame[0] == "metrics?":
            if self.on_metrics_wanted is not None:
                self.on_metrics_wanted(frame[1])
            return
        waiter = self._waiters.pop(frame[1], None)
        if waiter is None or waiter.done():
            return
        if frame[0] == "ok":
            waiter.set_result(frame[2])
        else:
            waiter.set_exception(error_from(frame[2]))

    async def call(self, op: str, *args: Any) -> Any:
        if self._proto is None:
            raise ApiError(503, "decision owner unavailable", code="owner_unavailable")
        self._seq += 1
        seq = self._seq
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters[seq] = waiter
        self._proto.send((op, seq, *args))
        try:
            return await waiter
        finally:
            self._waiters.pop(seq, None)

    def tell(self, *message: Any, now: bool = False) -> None:
        if self._proto is not None:
            self._proto.send(message, now=now)
