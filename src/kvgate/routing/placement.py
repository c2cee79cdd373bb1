"""Where each route key's prefix lives: how many live prefixes each node holds.

A new prefix (one no node holds) brings its future requests along, so it is placed
like a new tenant: on the node holding the fewest live prefixes. This tracker counts,
per node, the route keys last dispatched there within ``ttl_s`` (the prefix index's
TTL: after that the index forgets the blocks too). Bounded: the least recently seen
keys are forgotten first.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from itertools import repeat


class Placements:
    def __init__(self, ttl_s: float = 120.0, max_keys: int = 100_000) -> None:
        self.ttl_s = ttl_s
        self.max_keys = max_keys
        self._keys: OrderedDict[str, tuple[str, float]] = OrderedDict()  # key → (node, seen)
        self._per_node: Counter[str] = Counter()

    def on_dispatch(self, route_key: str, node_id: str, now: float) -> None:
        previous = self._keys.pop(route_key, None)
        if previous is not None:
            self._per_node[previous[0]] -= 1
        self._keys[route_key] = (node_id, now)
        self._per_node[node_id] += 1
        self._expire(now)

    def _expire(self, now: float) -> None:
        keys = self._keys
        cutoff = now - self.ttl_s
        while keys:
            key, (node, seen) = next(iter(keys.items()))
            if seen >= cutoff and len(keys) <= self.max_keys:
                break
            del keys[key]
            self._per_node[node] -= 1

    def count(self, node_id: str) -> int:
        """Live prefixes (route keys) last dispatched to the node."""
        return self._per_node.get(node_id, 0)

    def counts(self, node_ids: list[str]) -> list[int]:
        """``count`` of each node, in order."""
        return list(map(self._per_node.get, node_ids, repeat(0)))

    def forget(self, node_id: str) -> None:
        for key in [k for k, (n, _) in self._keys.items() if n == node_id]:
            del self._keys[key]
        self._per_node.pop(node_id, None)
