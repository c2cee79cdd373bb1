"""One gateway replica's KV-event path: a subscriber per publishing node, one index.

Every replica runs its own hub on the same streams, so replicas agree on each node's cache
without sharing state. The hub binds its index to the router's node view (policy
``precise`` reads it from there) and follows the node view: a removed node's entries go,
a re-registered (restarted) node is resynced, and each node's KV block size is taken from
its reports (vLLM's ``cache_config_info``) unless ``kv_events.block_size`` overrides it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import zmq.asyncio
from prometheus_client import CollectorRegistry

from kvgate.adapters.vllm import KV_BLOCK_SIZE
from kvgate.kv_events.config import DEFAULT_BLOCK_SIZE, KvEventsConfig, NodeEventsConfig
from kvgate.kv_events.hashing import TokenBlockHasher
from kvgate.kv_events.index import PreciseIndex
from kvgate.kv_events.metrics import KvEventMetrics
from kvgate.kv_events.rehash import TokenRehasher
from kvgate.kv_events.render import NotRenderable
from kvgate.kv_events.signal import PreciseSignal, bind_signal, unbind_signal
from kvgate.kv_events.subscriber import KvEventSubscriber
from kvgate.kv_events.tokenizer import EngineHashes, PromptHasher
from kvgate.prompts import PromptError
from kvgate.routing.node_view import NodeView
from kvgate.types import NodeReport

log = logging.getLogger(__name__)

# What a prompt is hashed at for a node whose block size is not known yet: vLLM's GPU
# default and the CPU build's minimum (set kv_events.block_size to hash once).
UNLEARNED_BLOCK_SIZES = (16, 32)


def load_hashers(config: KvEventsConfig) -> dict[str, PromptHasher]:
    hashers: dict[str, PromptHasher] = {}
    for model, path in config.tokenizers.items():
        try:
            hashers[model] = PromptHasher(
                path,
                block_size=config.block_size or DEFAULT_BLOCK_SIZE,
                algo=config.hash_algo,
                seed=config.hash_seed,
            )
        except ValueError as exc:
            raise ValueError(f"kv_events.tokenizers.{model}: {exc}") from None
    return hashers


class KvEventHub:
    def __init__(
        self,
        config: KvEventsConfig,
        node_view: NodeView,
        *,
        registry: CollectorRegistry | None = None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.node_view = node_view
        self.index = PreciseIndex()
        self.metrics = KvEventMetrics(registry)
        self.signal = PreciseSignal(
            self.index,
            self.metrics,
            config.block_size or DEFAULT_BLOCK_SIZE,
            override=config.block_size,
        )
        self.hashers = load_hashers(config)
        self.subscribers: dict[str, KvEventSubscriber] = {}
        self._now = now
        self._ctx: zmq.asyncio.Context | None = None
        self._stopping: set[asyncio.Task[None]] = set()
        bind_signal(node_view, self.signal)
        node_view.subscribe(
            on_remove=self.remove, on_reregister=self._reregistered, on_report=self._reported
        )

    # -- prompts -----------------------------------------------------------------------
    def block_sizes(self) -> set[int]:
        """The KV block sizes a prompt is hashed at: the override; else the sizes the
        subscribed nodes use, plus ``UNLEARNED_BLOCK_SIZES`` while one of them has not said
        yet, or in a hub that follows no node (a worker process that only hashes)."""
        if self.config.block_size is not None:
            return {self.config.block_size}
        learned = {n: self.signal.learned_block_size(n) for n in self.subscribers}
        sizes = {bs for bs in learned.values() if bs is not None}
        if not learned or None in learned.values():
            sizes.update(UNLEARNED_BLOCK_SIZES)
        return sizes

    def engine_hashes(
        self, model: str, endpoint: str, body: Mapping[str, Any]
    ) -> EngineHashes | None:
        """The request's prompt as the model's engines compute it (token count and block
        hashes per KV block size), or None: no tokenizer for the model, or a request the
        gateway cannot render exactly (routed on the approximate index)."""
        hasher = self.hashers.get(model)
        if hasher is None:
            return None
        try:
            ids = hasher.engine_tokens(endpoint, body)
        except (NotRenderable, PromptError):
            self.metrics.unrendered.inc()
            return None
        return hasher.hash_ids(ids, self.block_sizes())

    # -- nodes -------------------------------------------------------------------------
    def start(self) -> None:
        if self._ctx is None:
            self._ctx = zmq.asyncio.Context()

    def add(
        self, node_id: str, events: NodeEventsConfig, engine_type: str = "vllm"
    ) -> KvEventSubscriber:
        self.start()
        assert self._ctx is not None
        old = self.subscribers.pop(node_id, None)
        if old is not None:
            self._stop_later(old)
        sub = KvEventSubscriber(
            node_id,
            events.endpoint,
            index=self.index,
            metrics=self.metrics,
            context=self._ctx,
            replay_endpoint=events.replay_endpoint,
            topic=events.topic,
            now=self._now,
            replay_timeout_s=self.config.replay_timeout_s,
            rehasher=self._rehasher() if events.hash_source(engine_type) == "tokens" else None,
        )
        self.subscribers[node_id] = sub
        sub.start()
        log.info("kv events: subscribed to %s at %s", node_id, events.endpoint)
        return sub

    def _rehasher(self) -> TokenRehasher:
        cfg = self.config
        hasher = TokenBlockHasher(
            cfg.block_size or DEFAULT_BLOCK_SIZE, cfg.hash_algo, cfg.hash_seed
        )
        return TokenRehasher(hasher, fixed=cfg.block_size is not None)

    def _reported(self, node_id: str, report: NodeReport, _dispatched: int) -> None:
        size = report.extra.get(KV_BLOCK_SIZE)
        if size is not None and size >= 1 and not report.stale:
            self.signal.block_sizes[node_id] = int(size)
        if node_id in self.subscribers:
            self.metrics.block_size.labels(node_id).set(self.signal.block_size_of(node_id))

    def remove(self, node_id: str) -> None:
        sub = self.subscribers.pop(node_id, None)
        if sub is not None:
            self._stop_later(sub)
        self.index.forget(node_id)
        self.signal.block_sizes.pop(node_id, None)
        self.signal.pending.forget(node_id)

    def _stop_later(self, sub: KvEventSubscriber) -> None:
        task = asyncio.get_running_loop().create_task(sub.stop())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def _reregistered(self, node_id: str) -> None:
        self.signal.pending.forget(node_id)
        sub = self.subscribers.get(node_id)
        if sub is not None:
            sub.resync("reregister")
        else:
            self.index.resync(node_id)

    async def stop(self) -> None:
        subs = list(self.subscribers.values())
        self.subscribers.clear()
        await asyncio.gather(*(s.stop() for s in subs), *self._stopping, return_exceptions=True)
        unbind_signal(self.node_view)
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
