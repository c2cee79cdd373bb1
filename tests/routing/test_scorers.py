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
