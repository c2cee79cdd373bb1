from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from kvgate.clock import ManualClock
from kvgate.flags import Flags
from kvgate.routing import NodeView, Router, RoutingConfig, route_request_from_tokens
from kvgate.tokens import block_hashes
from kvgate.types import NodeReport, NodeSpec, RouteRequest


class Cluster:
    """A Router over n nodes with a ManualClock; helpers to report and send requests."""

    def __init__(self, n: int = 4, seed: int = 7, **config: object) -> None:
        self.clock = ManualClock(1000.0)
        self.config = RoutingConfig(**config)  # type: ignore[arg-type]
        self.flags = Flags()
        self.nodes = NodeView(self.clock, self.config)
        for i in range(n):
            self.nodes.add_node(NodeSpec(f"n{i}", f"http://127.0.0.1:{9000 + i}"))
        self.router = Router(
            self.config,
            self.nodes,
            flags=self.flags,
            clock=self.clock,
            rng=random.Random(seed),
        )
        self._seq = 0

    def report(self, node_id: str, **fields: object) -> None:
        self.nodes.apply_report(NodeReport(node_id=node_id, timestamp=self.clock.now(), **fields))  # type: ignore[arg-type]

    def report_all(self, **fields: object) -> None:
        for node_id in self.nodes.node_ids:
            self.report(node_id, **fields)

    def serve(
        self, req: RouteRequest, *, cached: int | None = None, exclude: tuple[str, ...] = ()
    ) -> str:
        """Route, dispatch and complete one request; ``cached`` defaults to the prediction."""
        decision = self.router.route(req, exclude=exclude)
        self.router.on_dispatch(req, decision)
        actual = decision.expected_cached_tokens if cached is None else cached
        self.router.on_complete(req, decision, ok=True, actual_cached_tokens=actual)
        return decision.node_id


def group_request(
    group: int, request_id: str, *, prefix_blocks: int = 32, tail: int = 2
) -> RouteRequest:
    """A request whose first ``prefix_blocks`` blocks are shared by its group."""
    pieces = [f" g{group}w{i}" for i in range(prefix_blocks * 16)]
    pieces += [f" {request_id}t{i}" for i in range(tail * 16 + 3)]
    return route_request_from_tokens(
        request_id=request_id,
        model="m",
        prompt_tokens=len(pieces),
        block_hashes=block_hashes(pieces),
        route_key=f"m:group-{group}",
        max_tokens=16,
    )


@pytest.fixture
def cluster_factory() -> Callable[..., Cluster]:
    return Cluster
