"""Predicted prefill backlog per node, in seconds: what a new request would wait for.

TTFT is driven by the prompt tokens a node still has to compute ahead of a new request,
not by how many requests are decoding there. The gateway knows what it dispatched: each
dispatch adds its *uncached* prompt tokens (prompt − expected cached) to the node's
queue, which drains at the node's prefill rate (engines prefill first come, first
served, in chunks). So the queue is a "busy until" time per node:

    busy_until = max(busy_until, now) + max(step_s, uncached / prefill_rate)

and the expected queueing delay of a request arriving now is ``busy_until − now``.
Observations re-anchor it: when a request is seen past its prefill (its first tokens
or its completion), everything dispatched to the node before it is past prefill too
(engines prefill first come, first served), so the queue shrinks by however much
earlier than predicted that happened; a fresh report with nothing waiting and no
dispatch since means the backlog cannot exceed one step. This is the gateway ledger's view of work
dispatched but not yet reported, in time units a spill decision can compare with the
cost of re-prefilling a prefix elsewhere.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PrefillModel:
    """How fast a node turns prompt tokens into KV: a rate and a per-step cost."""

    tokens_per_s: float
    step_s: float  # one engine step with the decode batch riding along

    def prefill_s(self, uncached_tokens: int) -> float:
        """One step or the prompt's compute, whichever is longer: a step's fixed cost
        (weights and the decode batch's KV read from memory) overlaps its compute
        (the roofline), so the two do not add — a 200-token prefill takes one step."""
        return max(self.step_s, max(0, uncached_tokens) / self.tokens_per_s)


class PrefillQueue:
    def __init__(self, model: PrefillModel, traffic_window_s: float = 60.0) -> None:
        self.model = model
        self.traffic_window_s = traffic_window_s
        self._busy_until: dict[str, float] = {}
        # per node, dispatched requests not yet seen past prefill → predicted prefill end
        self._pending: dict[str, OrderedDict[str, float]] = {}
        # requests dispatched recently, exponentially decayed: (value, as of time)
        self._traffic: dict[str, tuple[float, float]] = {}
        # Nodes whose busy-until may be after the latest ``now`` seen: every node set to
        # a time after the ``now`` of its call is added, and ``backlogged`` drops those
        # it finds idle. So with ``now`` never going back, a node left out is idle, and
        # ``backlogged`` reads a handful of nodes instead of all of them.
        self._ahead: dict[str, None] = {}
        self._latest = -math.inf

    def traffic(self, node_id: str, now: float) -> float:
        """Requests dispatched to the node over roughly the last ``traffic_window_s``."""
        value, at = self._traffic.get(node_id, (0.0, now))
        return value * math.exp(-(now - at) / self.traffic_window_s)

    def traffics(self, node_ids: list[str], now: float) -> dict[str, float]:
        """``traffic`` of each node, in one pass (a new prefix's placement reads them all)."""
        get = self._traffic.get
        exp = math.exp
        window = self.traffic_window_s
        # a node with no traffic yet: 0.0, as traffic() computes it (0.0 × exp(0));
        # (at − now) is −(now − at) exactly (IEEE subtraction is sign-symmetric)
        return {
            n: 0.0 if (held := get(n)) is None else held[0] * exp((held[1] - now) / window)
            for n in node_ids
        }

    def delay(self, node_id: str, now: float) -> float:
        """Seconds a request dispatched now would wait before its own prefill starts."""
        return max(0.0, self._busy_until.get(node_id, now) - now)

    def delays(self, node_ids: list[str], now: float) -> dict[str, float]:
        busy = self._busy_until
        return {n: max(0.0, busy.get(n, now) - now) for n in node_ids}

    def backlogged(self, now: float) -> dict[str, float]:
        """The nodes whose delay is above 0, with it (every other node's is 0)."""
        busy = self._busy_until
        if now < self._latest:  # a clock that went back: the kept set may miss a node
            return {n: until - now for n, until in busy.items() if until > now}
        self._latest = now
        out: dict[str, float] = {}
        idle: list[str] = []
        for n in self._ahead:
            until = busy[n]
            if until > now:
                out[n] = until - now
            else:
                idle.append(n)
        for n in idle:
            del self._ahead[n]
        return out

    def _set_busy(self, node_id: str, until: float, now: float) -> None:
        self._busy_until[node_id] = until
        if until > now:
            self._ahead[node_id] = None
        if now > self._latest:
            self._latest = now

    def on_dispatch(self, node_id: str, request_id: str, uncached_tokens: int, now: float) -> None:
        start = max(self._busy_until.get(node_id, now), now)
        end = start + self.model.prefill_s(uncached_tokens)
        self._set_busy(node_id, end, now)
        pending = self._pending.setdefault(node_id, OrderedDict())
        pending.pop(request_id, None)
        pending[request_id] = end
        self._traffic[node_id] = (self.traffic(node_id, now) + 1.0, now)

    def on_prefilled(self, node_id: str, request_id: str, now: float) -> None:
        """The request is past its prefill (first tokens seen, or it finished or failed)."""
        pending = self._pending.get(node_id)
        if not pending or request_id not in pending:
            return
        predicted = pending[request_id]
        while pending:
            rid, _ = pending.popitem(last=False)
            if rid == request_id:
                break
        early = min(0.0, now - predicted)  # observations can be late, never early
        busy = self._busy_until.get(node_id, now) + early
        self._set_busy(node_id, max(now, busy) if pending else min(busy, now), now)

    def on_report(self, node_id: str, now: float, *, idle: bool) -> None:
        """A fresh report; ``idle``: nothing waiting and nothing dispatched since."""
        if idle:
            self._set_busy(
                node_id, min(self._busy_until.get(node_id, now), now + self.model.step_s), now
            )

    def forget(self, node_id: str) -> None:
        self._busy_until.pop(node_id, None)
        self._ahead.pop(node_id, None)
        self._pending.pop(node_id, None)
        self._traffic.pop(node_id, None)
