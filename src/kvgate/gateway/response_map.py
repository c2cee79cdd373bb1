"""Which node holds each stored response: a map in the shared store, so every gateway
replica sends a ``previous_response_id`` back to the engine that made that response.

Key ``/kvgate/responses/<response id>`` → ``{"node", "tokens", "started"}`` (JSON), held
under a TTL: the node that answered, the conversation's tokens so far (the follow-up's
engine prompt starts with them: admission counts them, the route expects them cached),
and that node's engine process start time when it was written (a later start time means
the engine restarted and lost its stored responses). A store outage never fails a
request: a lookup that cannot be answered routes as a miss (the engine answers 404 if
the response is not there), a write that fails is counted and logged.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from kvgate.store.base import KVStore
from kvgate.store.errors import StoreUnavailable
from kvgate.store.keys import ROOT

log = logging.getLogger("kvgate.gateway.responses")

RESPONSES_PREFIX = f"{ROOT}/responses/"
# vLLM keeps stored responses in memory until it restarts; a day bounds the map's size
DEFAULT_TTL_S = 24 * 3600.0
LOOKUP_RESULTS = ("hit", "miss", "node_gone", "store_error")
GONE_REASONS = ("removed", "ejected", "unreachable", "restarted", "unanswered")


def response_key(response_id: str) -> str:
    return f"{RESPONSES_PREFIX}{response_id}"


@dataclass(frozen=True, slots=True)
class Holder:
    """The node holding one stored response."""

    node_id: str
    tokens: int  # the conversation's tokens so far (its prompt and output)
    started: float | None = None  # the node's engine process start time, when known

    def encode(self) -> str:
        return json.dumps({"node": self.node_id, "tokens": self.tokens, "started": self.started})

    @classmethod
    def decode(cls, raw: str) -> Holder | None:
        try:
            value = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(value, dict) or not isinstance(value.get("node"), str):
            return None
        tokens = value.get("tokens")
        started = value.get("started")
        return cls(
            value["node"],
            tokens if isinstance(tokens, int) and tokens >= 0 else 0,
            float(started) if isinstance(started, int | float) else None,
        )


class ResponseMap:
    """Lookups and writes of the response → node map, with their metrics."""

    def __init__(
        self, store: KVStore, registry: CollectorRegistry, *, ttl_s: float = DEFAULT_TTL_S
    ) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.lookups = Counter(
            "kvgate_response_affinity_lookups",
            "previous_response_id lookups: hit (routed to its node), miss (routed normally), "
            "node_gone (404), store_error (routed normally)",
            ["result"],
            registry=registry,
        )
        self.writes = Counter(
            "kvgate_response_affinity_writes",
            "Response → node map writes, by result (ok, store_error)",
            ["result"],
            registry=registry,
        )
        self.gone = Counter(
            "kvgate_response_affinity_node_gone",
            "Follow-ups answered 404 because the node holding the response is gone, by why",
            ["why"],
            registry=registry,
        )
        for result in LOOKUP_RESULTS:
            self.lookups.labels(result)
        for why in GONE_REASONS:
            self.gone.labels(why)

    async def lookup(self, response_id: str) -> Holder | None:
        """The holder of ``response_id``; None (counted as a miss or a store error) if unknown."""
        try:
            raw = await self.store.get(response_key(response_id))
        except StoreUnavailable as exc:
            self.lookups.labels("store_error").inc()
            log.warning("response map lookup failed (routing it normally): %s", exc)
            return None
        holder = Holder.decode(raw) if raw is not None else None
        if holder is None:
            self.lookups.labels("miss").inc()
        return holder

    def hit(self) -> None:
        self.lookups.labels("hit").inc()

    def node_gone(self, why: str, *, looked_up: bool = True) -> None:
        """A follow-up whose node is gone; ``looked_up``: found so by the lookup (counted
        there), not by its attempt failing afterwards."""
        if looked_up:
            self.lookups.labels("node_gone").inc()
        self.gone.labels(why).inc()

    async def record(self, response_id: str, holder: Holder) -> bool:
        try:
            await self.store.put(response_key(response_id), holder.encode(), ttl=self.ttl_s)
        except StoreUnavailable as exc:
            self.writes.labels("store_error").inc()
            log.warning("response map write failed for node %s: %s", holder.node_id, exc)
            return False
        self.writes.labels("ok").inc()
        return True
