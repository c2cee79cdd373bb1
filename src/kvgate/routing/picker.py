"""Pickers: turn per-node scores into one node.

``pick_with_preference`` keeps a preferred (affine) node unless another scores better
by more than ``margin`` — the spill rule; without a preference it is ``ctx.pick``
(highest score; ties by lower load, then at random).
"""

from __future__ import annotations

from collections.abc import Mapping

from kvgate.routing.policies.base import RoutingContext


def pick_with_preference(
    ctx: RoutingContext, scores: Mapping[str, float], preferred: str | None, margin: float
) -> tuple[str, bool]:
    """(node, spilled): ``spilled`` when a preferred node was left for a better one."""
    best = ctx.pick(scores)
    if preferred is None or preferred not in scores:
        return best, False
    if scores[best] > scores[preferred] + margin + 1e-12:
        return best, True
    return preferred, False
