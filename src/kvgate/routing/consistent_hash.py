"""Consistent hashing with virtual nodes and bounded loads.

Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing with Bounded Loads" (2018): walking
clockwise from the key's point, a node whose load would exceed ``c`` × the average load is
skipped. Adding or removing a node only remaps the keys whose walk passes its points.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping

import xxhash

from kvgate.routing.prefix_index import RouteKeyCache


def _point(text: str) -> int:
    return xxhash.xxh3_64_intdigest(text.encode())


class HashRing:
    def __init__(
        self,
        nodes: Iterable[str] = (),
        *,
        virtual_nodes: int = 100,
        load_factor: float = 1.25,
        cache_size: int = 4096,
    ) -> None:
        if virtual_nodes < 1:
            raise ValueError("virtual_nodes must be at least 1")
        if load_factor <= 1.0:
            raise ValueError("load_factor must be greater than 1")
        self.virtual_nodes = virtual_nodes
        self.load_factor = load_factor
        self._points: list[int] = []
        self._owners: list[str] = []
        self._nodes: set[str] = set()
        self._walks = RouteKeyCache(cache_size)
        for n in nodes:
            self.add_node(n)

    @property
    def nodes(self) -> frozenset[str]:
        return frozenset(self._nodes)

    def add_node(self, node_id: str) -> None:
        if node_id in self._nodes:
            return
        self._nodes.add(node_id)
        for v in range(self.virtual_nodes):
            p = _point(f"{node_id}#{v}")
            i = bisect.bisect_left(self._points, p)
            self._points.insert(i, p)
            self._owners.insert(i, node_id)
        self._walks.clear()

    def remove_node(self, node_id: str) -> None:
        if node_id not in self._nodes:
            return
        self._nodes.discard(node_id)
        keep = [(p, o) for p, o in zip(self._points, self._owners, strict=True) if o != node_id]
        self._points = [p for p, _ in keep]
        self._owners = [o for _, o in keep]
        self._walks.clear()

    def walk(self, key: str) -> tuple[str, ...]:
        """Distinct nodes in clockwise order from the key's point (cached per key)."""
        cached = self._walks.get(key)
        if cached is not None:
            return cached
        order: list[str] = []
        if self._points:
            seen: set[str] = set()
            start = bisect.bisect_left(self._points, _point(key))
            n = len(self._points)
            for step in range(n):
                owner = self._owners[(start + step) % n]
                if owner not in seen:
                    seen.add(owner)
                    order.append(owner)
                    if len(seen) == len(self._nodes):
                        break
        result = tuple(order)
        self._walks.put(key, result)
        return result

    def home_set(
        self,
        key: str,
        k: int,
        loads: Mapping[str, float] | None = None,
        allowed: Iterable[str] | None = None,
    ) -> list[str]:
        """Up to ``k`` nodes for ``key``; with ``loads``, skip nodes above c × average load."""
        walk = self.walk(key)
        filtered = False
        if allowed is not None:
            allowed_set = allowed.keys() if isinstance(allowed, dict) else set(allowed)
            if not self._nodes <= allowed_set:  # C-speed check: every ring node is allowed
                walk = tuple(n for n in walk if n in allowed_set)
                filtered = True
        if loads is None or not walk:
            return list(walk[:k])
        get = loads.get
        if not filtered and loads is allowed and len(loads) == len(walk):
            total = sum(loads.values())  # loads covers exactly the walk's nodes
        else:
            total = sum([get(n, 0.0) for n in walk])  # load scores are never negative
        capacity = math.ceil(self.load_factor * (total + 1.0) / len(walk))
        chosen: list[str] = []
        for n in walk:
            if get(n, 0.0) + 1.0 <= capacity:
                chosen.append(n)
                if len(chosen) == k:
                    return chosen
        # Everyone is above the bound (only possible with fractional loads): keep ring order.
        chosen += [n for n in walk if n not in chosen]
        return chosen[:k]
