"""The oracle's look-ahead: it places a request where it costs the next arrivals least.

Two idle nodes (the look-ahead runs only once a queue has formed somewhere; here it is
made to run on idle engines). A warm-up request leaves a 6,000-token system prompt S cached on one of
them. Then ``r`` arrives: a new 4,000-token prompt that starts with S's first blocks, so
the node holding S is its cheapest node by itself (greedy's choice). 2 ms later ``f``
arrives: S plus a question. Greedy would make ``f`` wait behind ``r``'s prefill or
prefill S again elsewhere; the look-ahead, which knows ``f`` is coming, sends ``r`` to
the other node.
"""

from __future__ import annotations

import functools

import pytest

from kvgate.sim import cluster
from kvgate.sim.cluster import ClusterSim, SimConfig
from kvgate.sim.reference_policies import OraclePolicy
from kvgate.workloads.base import WorkItem, Workload


def _words(prefix: str, n: int) -> str:
    return " ".join(f"{prefix}{i}" for i in range(n))


def _item(rid: str, at: float, system: str, user: str) -> WorkItem:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return WorkItem(rid, at, "t", messages, max_tokens=4, group=rid)


def _workload(gap_s: float) -> Workload:
    shared = _words("s", 3000)
    items = [
        _item("warm", 0.0, shared, "hello"),
        # shares S's first few hundred tokens, then its own 4,000
        _item("r", 1.0, _words("s", 200) + " " + _words("r", 2000), "go"),
        _item("f", 1.0 + gap_s, shared, "question"),
    ]
    return Workload("lookahead", 0, {}, items)


def _run(gap_s: float) -> dict[str, tuple[str | None, str | None, int, float]]:
    result = ClusterSim(_workload(gap_s), SimConfig(nodes=2), "oracle").run()
    return {
        r.request_id: (r.node, r.route_reason, r.cached_tokens, r.ttft or 0.0)
        for r in result.records
    }


def test_lookahead_keeps_the_next_arrivals_cache_free(monkeypatch: pytest.MonkeyPatch) -> None:
    greedy = _run(0.002)  # no queue anywhere: the greedy choice, r on S's node
    assert greedy["r"][0] == greedy["warm"][0] and greedy["r"][1] == "oracle", greedy
    always = functools.partial(OraclePolicy, only_when_queued=False)
    monkeypatch.setattr(cluster, "OraclePolicy", always)
    got = _run(0.002)
    warm_node = got["warm"][0]
    assert got["r"][0] != warm_node and got["r"][1] == "oracle_lookahead", got
    assert got["f"][0] == warm_node and got["f"][2] > 5000, got
    # f did not queue behind r's prefill: it waited only for its own step
    alone = _run(5.0)  # f arrives long after r: nothing to look ahead at
    assert alone["r"][0] == warm_node and alone["r"][1] == "oracle", alone
    assert got["f"][3] <= alone["f"][3] * 1.05, (got, alone)


def _demand_workload(hot_future: int) -> Workload:
    sa, sb, sr = _words("a", 300), _words("b", 300), _words("n", 300)
    items = [
        _item("a", 0.0, sa, "q"),
        _item("b", 0.001, sb, "q"),
        _item("b2", 0.002, sb, "q2"),  # b's node has the more recent traffic
        _item("r", 1.0, sr, "q"),  # a new prefix, both nodes idle
    ]
    items += [_item(f"a{i}", 2.0 + i, sa, f"later {i}") for i in range(hot_future)]
    items += [_item("b3", 2.5, sb, "later"), _item("r2", 9.0, sr, "later")]
    items.sort(key=lambda it: it.arrival)
    return Workload("demand", 0, {}, items)


def test_a_new_prefix_goes_where_the_coming_demand_is_least() -> None:
    """With the nodes equally idle, a new prefix joins the node whose prefixes bring
    fewer requests in the trace to come, not the one with less recent traffic."""

    def nodes(hot_future: int) -> dict[str, str | None]:
        result = ClusterSim(_demand_workload(hot_future), SimConfig(nodes=2), "oracle").run()
        return {r.request_id: r.node for r in result.records}

    busy = nodes(4)  # a's prefix is asked for 4 more times, b's once
    assert busy["a"] != busy["b"] and busy["r"] == busy["b"], busy
    calm = nodes(0)  # b's prefix is the one still wanted: r joins a's node
    assert calm["a"] != calm["b"] and calm["r"] == calm["a"], calm
