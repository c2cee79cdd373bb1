"""Non-generation endpoint kinds: least-load routing, no prefix placement, engine filter."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from kvgate.routing.endpoints import serves
from kvgate.types import NodeSpec, NoNodeAvailable, RouteRequest

from .conftest import Cluster, group_request

Factory = Callable[..., Cluster]


def _embedding(req: RouteRequest) -> RouteRequest:
    return dataclasses.replace(req, block_hashes=[], max_tokens=0, endpoint="embeddings")


def test_embeddings_go_by_least_load_and_place_nothing(cluster_factory: Factory) -> None:
    c = cluster_factory(n=3)
    c.report("n0", running=5)
    c.report("n1", running=0)
    c.report("n2", running=3)
    req = _embedding(group_request(1, "a"))
    decision = c.router.route(req)
    assert (decision.node_id, decision.reason, decision.policy) == (
        "n1",
        "least_load",
        "least_load",
    )
    c.router.on_dispatch(req, decision)
    c.router.on_complete(req, decision, ok=True, actual_cached_tokens=None)
    assert c.router.placements.count("n1") == 0
    assert len(c.router.index) == 0


def test_a_node_whose_engine_does_not_serve_the_endpoint_is_not_eligible(
    cluster_factory: Factory,
) -> None:
    c = cluster_factory(n=1)
    c.nodes.add_node(NodeSpec("tgi0", "http://127.0.0.1:9100", engine_type="tgi"))
    c.report("n0", running=9)
    c.report("tgi0", running=0)
    for i in range(5):
        assert c.router.route(_embedding(group_request(i, "a"))).node_id == "n0"
    c.nodes.remove_node("n0")
    with pytest.raises(NoNodeAvailable, match="endpoint=1"):
        c.router.route(_embedding(group_request(1, "b")))
    assert c.router.route(group_request(1, "c")).node_id == "tgi0"  # generation still goes


def test_engine_types_serving_each_endpoint() -> None:
    assert all(serves("vllm", k) for k in ("embeddings", "rerank", "tokenize", "detokenize"))
    assert serves("sim", "score") and serves("sglang", "embeddings")
    assert not serves("tgi", "embeddings") and serves("tgi", "generate")
