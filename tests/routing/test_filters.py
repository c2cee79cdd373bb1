"""The filters' verdict is reused between decisions; it must equal a fresh evaluation."""

from __future__ import annotations

from kvgate.clock import ManualClock
from kvgate.routing import NodeView, RoutingConfig, route_request_from_tokens
from kvgate.routing.filters import eligible_nodes
from kvgate.types import NodeReport, NodeSpec, NodeState, RouteRequest


def request(tokens: int = 100) -> RouteRequest:
    return route_request_from_tokens(
        request_id="r", model="m", prompt_tokens=tokens, block_hashes=[], route_key="k"
    )


def fresh(view: NodeView, req: RouteRequest, config: RoutingConfig, now: float) -> object:
    """The verdict computed from scratch (what every decision computed before reuse)."""
    view.eligibility.clear()
    entries, loads, dropped = eligible_nodes(view, req, config, now)
    return [e.node_id for e in entries], loads, dropped


def verdict(view: NodeView, req: RouteRequest, config: RoutingConfig, now: float) -> object:
    entries, loads, dropped = eligible_nodes(view, req, config, now)
    return [e.node_id for e in entries], loads, dropped


def test_reused_verdict_follows_every_change() -> None:
    clock = ManualClock(100.0)
    config = RoutingConfig(freshness_s=15)
    view = NodeView(clock, config)
    for i in range(4):
        view.add_node(NodeSpec(f"n{i}", f"http://n{i}"))
    req, big = request(), request(5000)

    def same() -> None:
        for r in (req, big):
            reused = verdict(view, r, config, clock.now())
            assert reused == fresh(view, r, config, clock.now())
            assert verdict(view, r, config, clock.now()) == reused  # and from the cache

    same()
    view.apply_report(NodeReport(node_id="n0", timestamp=clock.now(), running=3))
    same()
    view.on_dispatch("n1", "a", 500)  # load changes without a new verdict
    assert verdict(view, req, config, clock.now())[1]["n1"] == view.load("n1")  # type: ignore[index]
    same()
    view.set_state("n2", NodeState.BACKOFF)  # big requests avoid it
    same()
    assert "n2" not in verdict(view, big, config, clock.now())[0]  # type: ignore[index]
    clock.advance(10)
    view.apply_report(NodeReport(node_id="n3", timestamp=clock.now()))
    verdict(view, req, config, clock.now())
    clock.advance(6)  # n0..n2 have had no report for 16 s: stale, with no view change
    assert verdict(view, req, config, clock.now())[0] == ["n3"]  # type: ignore[index]
    same()
    view.remove_node("n3")
    same()


def test_exclusions_on_a_reused_verdict_count_like_a_fresh_one() -> None:
    clock = ManualClock(100.0)
    config = RoutingConfig()
    view = NodeView(clock, config)
    for i in range(4):
        view.add_node(NodeSpec(f"n{i}", f"http://n{i}"))
    view.set_state("n0", NodeState.QUIESCING)
    req = request()
    eligible_nodes(view, req, config, clock.now())  # cached without exclusions
    entries, loads, dropped = eligible_nodes(view, req, config, clock.now(), {"n0", "n1", "x"})
    assert [e.node_id for e in entries] == ["n2", "n3"] and list(loads) == ["n2", "n3"]
    assert dropped["excluded"] == 2 and dropped["state"] == 0
    entries, _, dropped = eligible_nodes(view, req, config, clock.now())  # cache untouched
    assert [e.node_id for e in entries] == ["n1", "n2", "n3"] and dropped["state"] == 1
