"""Consistent hashing with virtual nodes and bounded loads.

Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing with Bounded Loads" (2018): walking
clockwise from the key's point, a node whose load would exceed ``c`` × the average load is
skipped. Adding or removing a node only remaps the keys whose walk passes its points.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Iterator, Mapping

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
        self._walks: RouteKeyCache[_Walk] = RouteKeyCache(cache_size)
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

    def _walk(self, key: str) -> _Walk:
        walk = self._walks.get(key)
        if walk is None:
            start = bisect.bisect_left(self._points, _point(key)) if self._points else 0
            walk = _Walk(start)
            self._walks.put(key, walk)
        return walk

    def _extend(self, walk: _Walk) -> bool:
        """Add the walk's next distinct node; False when it already lists every node."""
        order, seen, owners = walk.order, walk.seen, self._owners
        if len(order) == len(self._nodes):
            return False
        n = len(owners)
        while True:
            owner = owners[(walk.start + walk.steps) % n]
            walk.steps += 1
            if owner not in seen:
                seen.add(owner)
                order.append(owner)
                return True

    def walk(self, key: str) -> tuple[str, ...]:
        """Distinct nodes in clockwise order from the key's point (cached per key)."""
        walk = self._walk(key)
        if walk.full is None:
            while self._extend(walk):
                pass
            walk.full = tuple(walk.order)
        return walk.full

    def _follow(self, key: str) -> Iterator[str]:
        """The key's walk, computed only as far as it is read."""
        walk = self._walk(key)
        i = 0
        while i < len(walk.order) or self._extend(walk):
            yield walk.order[i]
            i += 1

    def home_set(
        self,
        key: str,
        k: int,
        loads: Mapping[str, float] | None = None,
        allowed: Iterable[str] | None = None,
    ) -> list[str]:
        """Up to ``k`` nodes for ``key``; with ``loads``, skip nodes above c × average load.

        When every ring node is allowed, the walk is followed only as far as the answer
        needs (usually one or two nodes), not around the whole ring.
        """
        filtered: tuple[str, ...] | None = None
        if allowed is not None:
            allowed_set = allowed.keys() if isinstance(allowed, dict) else set(allowed)
            if not self._nodes <= allowed_set:  # C-speed check: every ring node is allowed
                filtered = tuple(n for n in self.walk(key) if n in allowed_set)

        def whole() -> tuple[str, ...]:
            return filtered if filtered is not None else self.walk(key)

        walk = iter(filtered) if filtered is not None else self._follow(key)
        size = len(filtered) if filtered is not None else len(self._nodes)
        if loads is None or not size:
            return list(itertools.islice(walk, k))
        get = loads.get
        if filtered is None and loads is allowed and len(loads) == size:
            total = sum(loads.values())  # loads covers exactly the walk's nodes
        else:
            total = sum([get(n, 0.0) for n in whole()])  # load scores are never negative
        capacity = math.ceil(self.load_factor * (total + 1.0) / size)
        chosen: list[str] = []
        for n in walk:
            if get(n, 0.0) + 1.0 <= capacity:
                chosen.append(n)
                if len(chosen) == k:
                    return chosen
        # Everyone is above the bound (only possible with fractional loads): keep ring order.
        chosen += [n for n in whole() if n not in chosen]
        return chosen[:k]


class _Walk:
    """A route key's walk, extended node by node as far as callers have needed it."""

    __slots__ = ("full", "order", "seen", "start", "steps")

    def __init__(self, start: int) -> None:
        self.start = start  # index of the key's point on the ring
        self.steps = 0  # ring points visited so far
        self.order: list[str] = []
        self.seen: set[str] = set()
        self.full: tuple[str, ...] | None = None
