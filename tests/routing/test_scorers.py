"""weighted_scores against a plain per-node loop: the same floats, bit for bit."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace
from typing import Any

import pytest

from kvgate.routing import scorers
from kvgate.routing.scorers import Scores, load_score, weighted_scores


def _random_scores(rng: random.Random, nodes: list[str]) -> Scores:
    values = [0.0, -0.0, 1.5, -2.25, 1e-9, 3.0, -7.0]
    kind = rng.choice(["each", "some", "every", "empty"])
    if kind == "each":
        return Scores(each=[rng.choice([*values, rng.uniform(-5, 5)]) for _ in nodes])
    picked = rng.sample(nodes, rng.randint(0, min(4, len(nodes))))
    some = {n: rng.choice([*values, rng.uniform(-5, 5)]) for n in picked}
    every = rng.choice(values) if kind == "every" else rng.choice([0.0, -0.0])
    return Scores(every=every, some=some)


def _plain(nodes: list[str], terms: list[tuple[float, Scores]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for i, n in enumerate(nodes):
        total = 0.0
        for weight, sc in terms:
            if weight == 0.0:
                continue
            if sc.each is not None:
                total = total + weight * sc.each[i]
            elif n in sc.some:
                total = total + weight * sc.some[n]
            elif sc.every != 0.0 or not math.isfinite(weight):
                total = total + weight * sc.every
        out[n] = total
    return out


@pytest.mark.parametrize("seed", range(40))
def test_weighted_scores_match_a_plain_loop(seed: int, monkeypatch: Any) -> None:
    rng = random.Random(seed)
    nodes = [f"n{i}" for i in range(rng.randint(1, 9))]
    loads = {n: rng.choice([0.0, 1.0, 2.5, rng.uniform(0, 6)]) for n in nodes}
    step = rng.choice([0.02, 0.05])
    ctx: Any = SimpleNamespace(loads=loads, prefill=SimpleNamespace(step_s=step))
    names = [f"s{k}" for k in range(rng.randint(1, 6))]
    # the load scorer somewhere in the list (the fused path), or not at all
    if rng.random() < 0.8:
        names.insert(rng.randint(0, len(names)), "load")
    fake: dict[str, Any] = {}
    terms: list[tuple[float, Scores]] = []
    weights: dict[str, float] = {}
    for name in names:
        weight = rng.choice([0.0, 1.0, 0.05, 2.0, 0.5, rng.uniform(0, 3)])
        weights[name] = weight
        if name == "load":
            fake[name] = load_score
            terms.append((weight, load_score(None, ctx)))  # type: ignore[arg-type]
        else:
            sc = _random_scores(rng, nodes)
            fake[name] = lambda req, c, sc=sc: sc
            terms.append((weight, sc))
    monkeypatch.setattr(scorers, "SCORERS", fake)
    got = weighted_scores(None, ctx, weights)  # type: ignore[arg-type]
    want = _plain(nodes, terms)
    assert list(got) == nodes
    assert [v.hex() for v in got.values()] == [v.hex() for v in want.values()]


def _scan_top(scores: dict[str, float], eps: float) -> list[str]:
    best = max(scores.values())
    return [n for n, s in scores.items() if s >= best - eps]


@pytest.mark.parametrize("seed", range(200))
def test_load_scores_read_and_rank_as_the_full_dict(seed: int, monkeypatch: Any) -> None:
    # hybrid's sums kept as parts (no dict over every node): each node's float, and the
    # near-best set a pick scans for, must be what the full dict gives, ties included
    from kvgate.routing.policies.base import RoutingContext
    from kvgate.routing.score_table import LoadScores

    rng = random.Random(seed)
    nodes = [f"n{i}" for i in range(rng.randint(1, 40))]
    grid = [0.0, 1.0, 2.0, 2.0 + 1e-12, 2.0 + 5e-8, 3.5, 1e6]
    loads = {n: rng.choice([*grid, rng.uniform(0, 5), rng.choice(grid) * 1.0000001]) for n in nodes}
    step = rng.choice([0.02, 0.05, 1e-7, 3.0])
    ctx: Any = SimpleNamespace(loads=loads, prefill=SimpleNamespace(step_s=step))
    names = [f"s{k}" for k in range(rng.randint(0, 4))] + ["load"]
    fake: dict[str, Any] = {"load": load_score}
    weights: dict[str, float] = {}
    for name in names:
        weights[name] = rng.choice([1.0, 0.05, 2.0, rng.uniform(0, 3), 1e-9, 1e8])
        if name != "load":
            sc = _random_scores(rng, nodes)
            if sc.each is not None:
                sc = Scores(every=rng.choice([0.0, 1e-10, 5e5]), some={})
            fake[name] = lambda req, c, sc=sc: sc
    monkeypatch.setattr(scorers, "SCORERS", fake)
    got = scorers.weighted_score_map(None, ctx, weights)  # type: ignore[arg-type]
    assert isinstance(got, LoadScores)
    want = weighted_scores(None, ctx, weights)  # type: ignore[arg-type]
    assert [got[n].hex() for n in nodes] == [v.hex() for v in want.values()]
    for eps in (1e-9, 0.0, 1e-3):
        top = got.top(eps)
        if top is not None:
            assert top == _scan_top(want, eps)
    fresh = LoadScores(got.loads, got.base, got.fixed, got.weight, got.neg_step)
    a = RoutingContext.__new__(RoutingContext)
    b = RoutingContext.__new__(RoutingContext)
    a.loads = b.loads = loads
    a.rng, b.rng = random.Random(seed), random.Random(seed)
    assert a.pick(fresh) == b.pick(dict(want))
    assert a.rng.random() == b.rng.random()  # the same draws, or none on both
