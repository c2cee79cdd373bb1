"""Expected cached tokens in the engine's units, at each node's own KV block size.

vLLM reuses whole cached blocks short of the block holding the prompt's last token; a
node's block size comes from its ``cache_config_info`` (the vLLM adapter's
``kv_block_size``), else its events, and ``kv_events.block_size`` overrides both.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from kvgate.adapters.vllm import KV_BLOCK_SIZE
from kvgate.clock import ManualClock
from kvgate.kv_events.config import KvEventsConfig, NodeEventsConfig
from kvgate.kv_events.hashing import TokenBlockHasher, engine_cached_tokens
from kvgate.kv_events.hub import UNLEARNED_BLOCK_SIZES, KvEventHub
from kvgate.kv_events.index import PreciseIndex
from kvgate.kv_events.metrics import KvEventMetrics
from kvgate.kv_events.signal import CombinedSignal, PreciseSignal
from kvgate.kv_events.wire import BlockStored, KVEventBatch
from kvgate.routing.config import RoutingConfig
from kvgate.routing.node_view import NodeView
from kvgate.routing.prefix_index import PrefixIndex
from kvgate.types import NodeReport, NodeSpec, RouteRequest


def test_the_last_prompt_token_is_never_a_cache_hit() -> None:
    assert engine_cached_tokens(20, 640, 32) == 608  # fully cached 640: 19 blocks reused
    assert engine_cached_tokens(20, 641, 32) == 640
    assert engine_cached_tokens(3, 641, 32) == 96
    assert engine_cached_tokens(5, 1, 32) == 0


def _request(ids: list[int], sizes: tuple[int, ...]) -> RouteRequest:
    hashes = {bs: TokenBlockHasher(bs).hashes(ids) for bs in sizes}
    return RouteRequest(
        request_id="r",
        model="m",
        prompt_tokens=len(ids) // 2,  # kvgate's text-model count: not what the engine counts
        block_hashes=[7, 8, 9],
        route_key="k",
        engine_block_hashes=hashes,
        engine_prompt_tokens=len(ids),
    )


def test_each_synced_node_is_counted_at_its_own_block_size() -> None:
    ids = list(range(100, 300))  # 200 engine tokens
    req = _request(ids, (16, 32))
    index = PreciseIndex()
    bound = PreciseSignal(index, KvEventMetrics(), block_size=16)
    bound.block_sizes.update({"a": 32, "b": 16})
    assert req.engine_block_hashes is not None
    index.apply(
        "a", KVEventBatch(0.0, [BlockStored(req.engine_block_hashes[32], None, [], 32)]), 0.0
    )
    index.apply(
        "b", KVEventBatch(0.0, [BlockStored(req.engine_block_hashes[16][:5], None, [], 16)]), 0.0
    )
    approx = PrefixIndex()
    approx.record("c", [7, 8], 0.0)  # c publishes nothing: kvgate's guess in its own units
    signal = CombinedSignal(index, approx, bound=bound)
    # a: all 6 full blocks of 32 are cached, the 7th holds the last token: 192; b: 5 x 16
    assert signal.match_tokens(req, 10.0) == {"a": 192, "b": 80, "c": 32}
    assert signal.match_tokens(req, 10.0, ["a"]) == {"a": 192}
    # a dispatch recorded as pending counts until its events arrive
    bound.pending.record("b", req.engine_block_hashes[16], 10.0)
    assert signal.match_tokens(req, 10.5, ["b"]) == {"b": 192}
    assert signal.match_tokens(req, 12.0, ["b"]) == {"b": 80}
    bound.override = 16  # kv_events.block_size set: every node is hashed at it
    assert signal.match_tokens(req, 12.0, ["a"]) == {}


def test_the_hub_learns_block_sizes_from_reports_and_events(tokenizer_path: Path) -> None:
    async def run() -> None:
        view = NodeView(ManualClock(), RoutingConfig())
        view.add_node(NodeSpec("v0", "http://127.0.0.1:1"))
        view.add_node(NodeSpec("v1", "http://127.0.0.1:2"))
        hub = KvEventHub(KvEventsConfig(tokenizers={"m": str(tokenizer_path)}), view)
        hub.add("v0", NodeEventsConfig(endpoint="ipc:///nonexistent/a"))
        hub.add("v1", NodeEventsConfig(endpoint="ipc:///nonexistent/b"))
        try:
            assert hub.block_sizes() == set(UNLEARNED_BLOCK_SIZES)  # nothing said yet
            view.apply_report(NodeReport("v0", timestamp=0.0, extra={KV_BLOCK_SIZE: 32.0}))
            hub.index.apply("v1", KVEventBatch(0.0, [BlockStored([1], None, [], 64)]), 0.0)
            assert hub.signal.block_size_of("v0") == 32 and hub.signal.block_size_of("v1") == 64
            assert hub.block_sizes() == {32, 64}
            body = {"messages": [{"role": "user", "content": "cache prefix"}]}
            out = hub.engine_hashes("m", "chat", body)
            assert out is not None and set(out.by_block_size) == {32, 64}
            assert hub.engine_hashes("other", "chat", body) is None  # no tokenizer for it
            image = {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}
            assert hub.engine_hashes("m", "chat", image) is not None  # canonical: no template
        finally:
            await hub.stop()
        fixed = KvEventHub(KvEventsConfig(block_size=16), NodeView(ManualClock(), RoutingConfig()))
        assert fixed.block_sizes() == {16}
        await fixed.stop()

    asyncio.run(run())
