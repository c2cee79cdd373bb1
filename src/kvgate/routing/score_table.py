"""A weighted score sum kept as its parts, for the default policy's one per-node term.

When every scorer but the last, ``load``, says "one value on every node but these few"
(``scorers.Scores``), the sum on a node is ``partial + weight × (−step × load)``, with
``partial`` one value (``base``) on all nodes but those in ``fixed``. ``LoadScores``
reads a node's sum from those parts instead of building a dict over every node, and
finds the best nodes from the loads: the sum is non-increasing in the load, so outside
``fixed`` the best is at the least load and the near-best are the nodes whose load is
below a bound (``top``). Every sum it gives is the float the full dict would hold.
"""

from __future__ import annotations

import math
from collections.abc import ItemsView, Iterator, Mapping, ValuesView


class LoadScores(Mapping[str, float]):
    __slots__ = ("_dict", "base", "fixed", "loads", "neg_step", "weight")

    def __init__(
        self,
        loads: dict[str, float],
        base: float,
        fixed: dict[str, float],
        weight: float,
        neg_step: float,
    ) -> None:
        self.loads = loads
        self.base = base
        self.fixed = fixed  # every key is in loads
        self.weight = weight
        self.neg_step = neg_step
        self._dict: dict[str, float] | None = None

    def __getitem__(self, node_id: str) -> float:
        return self.fixed.get(node_id, self.base) + self.weight * (
            self.neg_step * self.loads[node_id]
        )

    def __contains__(self, node_id: object) -> bool:
        return node_id in self.loads

    def __iter__(self) -> Iterator[str]:
        return iter(self.loads)

    def __len__(self) -> int:
        return len(self.loads)

    def as_dict(self) -> dict[str, float]:
        """Every node's sum, in the loads' order."""
        if self._dict is None:
            base, weight, neg_step, loads = self.base, self.weight, self.neg_step, self.loads
            sums = {n: base + weight * (neg_step * load) for n, load in loads.items()}
            for n, total in self.fixed.items():
                sums[n] = total + weight * (neg_step * loads[n])
            self._dict = sums
        return self._dict

    def values(self) -> ValuesView[float]:
        return self.as_dict().values()

    def items(self) -> ItemsView[str, float]:
        return self.as_dict().items()

    def top(self, eps: float) -> list[str] | None:
        """The nodes scoring at least the best − ``eps``, in the loads' order (what a scan
        of every node finds); None where the shortcut does not apply (then scan)."""
        loads, fixed, base, weight, neg_step = (
            self.loads,
            self.fixed,
            self.base,
            self.weight,
            self.neg_step,
        )
        if not (
            loads
            and 0.0 < weight < math.inf
            and -math.inf < neg_step < 0.0
            and math.isfinite(base)
            and math.isfinite(sum(loads.values()))
        ):
            return None
        least = min(loads.values())
        if least < 0.0 or any(loads[n] <= least for n in fixed):
            return None  # the least load may not be outside fixed: scan
        best = base + weight * (neg_step * least)  # the best sum outside fixed
        for n, total in fixed.items():
            s = total + weight * (neg_step * loads[n])
            if not math.isfinite(s):
                return None
            if s > best:
                best = s
        thr = best - eps
        # a node outside fixed reaches thr only below this load (with room for rounding:
        # any extra node is dropped by the exact test below)
        bound = ((base - thr) + 1e-12 * (1.0 + abs(base) + abs(thr))) / (weight * -neg_step)
        bound += abs(bound) * 1e-9 + 1e-12
        if not math.isfinite(bound):
            return None
        top = [
            n
            for n, load in loads.items()
            if load <= bound and n not in fixed and base + weight * (neg_step * load) >= thr
        ]
        hits = [n for n, total in fixed.items() if total + weight * (neg_step * loads[n]) >= thr]
        if hits:
            order = list(loads)
            top = sorted([*top, *hits], key=order.index)
        return top
