"""The named workloads. Every generator is deterministic for its seed."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from kvgate.tokens import synthetic_text
from kvgate.workloads.apps import DEFAULTS as APPS_DEFAULTS
from kvgate.workloads.apps import DESCRIPTION as APPS_DESCRIPTION
from kvgate.workloads.apps import generate_apps
from kvgate.workloads.base import WorkItem, Workload
from kvgate.workloads.daily import ENTRY as DAILY

Generator = Callable[[random.Random, dict[str, Any]], tuple[list[WorkItem], dict[str, Any]]]


def _chat(
    system: str | None, user: str, history: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    if system is not None:
        msgs.append({"role": "system", "content": system})
    msgs.extend(history or [])
    msgs.append({"role": "user", "content": user})
    return msgs


def _poisson_times(rng: random.Random, n: int, rate: float) -> list[float]:
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def _query(
    p: dict[str, Any], request_id: str, arrival: float, prefix: str, query: str, group: str
) -> WorkItem:
    """A default-tenant request: ``prefix`` as the system message, then ``query``."""
    return WorkItem(
        request_id=request_id,
        arrival=arrival,
        tenant="default",
        messages=_chat(prefix, query),
        max_tokens=int(p["output_len"]),
        group=group,
    )


def _on_prefixes(
    rng: random.Random,
    p: dict[str, Any],
    tag: str,
    prefixes: list[str],
    picks: list[int],
    times: list[float],
    query_len: int,
    group_tag: str,
) -> list[WorkItem]:
    """Request k: prefix ``picks[k]`` and a fresh ``query_len`` query, at ``times[k]``."""
    items = []
    for k, g in enumerate(picks):
        query = synthetic_text(query_len, rng)
        items.append(_query(p, f"{tag}-{k}", times[k], prefixes[g], query, f"{group_tag}{g}"))
    return items


def _shared_prefix(rng: random.Random, p: dict[str, Any]) -> tuple[list[WorkItem], dict[str, Any]]:
    groups, per_group = int(p["groups"]), int(p["prompts_per_group"])
    systems = [synthetic_text(int(p["system_len"]), rng) for _ in range(groups)]
    pairs = [(g, i) for g in range(groups) for i in range(per_group)]
    rng.shuffle(pairs)
    n = min(len(pairs), int(p["requests"])) if p.get("requests") else len(pairs)
    times = _poisson_times(rng, n, float(p["rate"]))
    picks = [g for g, _i in pairs[:n]]
    items = _on_prefixes(rng, p, "sp", systems, picks, times, int(p["question_len"]), "g")
    kv = p.get("cluster_kv_tokens")
    return items, ({"cluster_kv_tokens": int(kv)} if kv else {})


def _tenant_prefix(rng: random.Random, p: dict[str, Any]) -> tuple[list[WorkItem], dict[str, Any]]:
    customers, users = int(p["customers"]), int(p["users_per_customer"])
    prefixes = [synthetic_text(int(p["prefix_len"]), rng) for _ in range(customers)]
    n = int(p["requests"]) if p.get("requests") else customers * users * 2
    times = _poisson_times(rng, n, float(p["rate"]))
    items = []
    for k in range(n):
        c = rng.randrange(customers)
        query = synthetic_text(int(p["query_len"]), rng)
        group = f"c{c}u{rng.randrange(users)}"  # drawn after the query: the seeded order
        items.append(_query(p, f"tp-{k}", times[k], prefixes[c], query, group))
    # prefixes need `kv_fraction` of the cluster's KV: the simulator sizes engines from it
    kv_tokens = customers * int(p["prefix_len"]) / float(p["kv_fraction"])
    return items, {"cluster_kv_tokens": int(kv_tokens)}


def _multi_turn(rng: random.Random, p: dict[str, Any]) -> tuple[list[WorkItem], dict[str, Any]]:
    n_target = int(p["requests"]) if p.get("requests") else 400
    rate = float(p["rate"])  # new conversations per second
    mean_turns = float(p["mean_turns"])
    system = synthetic_text(int(p["system_len"]), rng)
    items: list[WorkItem] = []
    conv, start = 0, 0.0
    while len(items) < n_target:
        start += rng.expovariate(rate)
        turns = 1 + int(rng.expovariate(1.0 / max(mean_turns - 1.0, 1e-9)))
        history: list[dict[str, Any]] = []
        t = start
        for turn in range(turns):
            if len(items) >= n_target:
                break
            user_len = max(4, int(rng.lognormvariate(math.log(float(p["user_median"])), 0.8)))
            out_len = max(8, int(rng.lognormvariate(math.log(float(p["output_median"])), 0.6)))
            out_len = min(out_len, int(p["max_output"]))
            user = synthetic_text(min(user_len, int(p["max_user"])), rng)
            items.append(
                WorkItem(
                    request_id=f"mt-{conv}-{turn}",
                    arrival=t,
                    tenant="default",
                    messages=_chat(system, user, list(history)),
                    max_tokens=out_len,
                    group=f"conv{conv}",
                )
            )
            history += [
                {"role": "user", "content": user},
                {"role": "assistant", "content": synthetic_text(out_len, rng)},
            ]
            # the next turn comes after the answer (estimated) and a think time
            t += out_len * float(p["est_tpot_s"]) + rng.expovariate(1.0 / float(p["think_s"]))
        conv += 1
    items.sort(key=lambda w: (w.arrival, w.request_id))
    return items, {}


def _tool_agent(rng: random.Random, p: dict[str, Any]) -> tuple[list[WorkItem], dict[str, Any]]:
    agents = int(p["agents"])
    schemas = [synthetic_text(int(p["schema_len"]), rng) for _ in range(agents)]
    n = int(p["requests"]) if p.get("requests") else 600
    times = _poisson_times(rng, n, float(p["rate"]))
    items = []
    for k in range(n):
        a = rng.randrange(agents)
        q = rng.randint(int(p["query_min"]), int(p["query_max"]))
        items.append(
            _query(p, f"ta-{k}", times[k], schemas[a], synthetic_text(q, rng), f"agent{a}")
        )
    return items, {}


def _long_short_mix(rng: random.Random, p: dict[str, Any]) -> tuple[list[WorkItem], dict[str, Any]]:
    n = int(p["requests"]) if p.get("requests") else 500
    times = _poisson_times(rng, n, float(p["rate"]))
    system = synthetic_text(int(p["system_len"]), rng)
    items = []
    for k in range(n):
        long = rng.random() < float(p["long_fraction"])
        prompt = int(p["long_prompt"] if long else p["short_prompt"])
        out = int(p["long_output"] if long else p["short_output"])
        items.append(
            WorkItem(
                request_id=f"ls-{k}",
                arrival=times[k],
                tenant="long" if long else "short",
                messages=_chat(system, synthetic_text(prompt, rng)),
                max_tokens=out,
                group="long" if long else "short",
            )
        )
    tenants = {
        "short": {"guaranteed_fraction": 0.5, "weight": 1},
        "long": {"guaranteed_fraction": 0.3, "weight": 1},
    }
    return items, {"tenants": tenants}


def _overload(rng: random.Random, p: dict[str, Any]) -> tuple[list[WorkItem], dict[str, Any]]:
    n = int(p["requests"]) if p.get("requests") else 600
    rate = float(p["rate"]) * float(p["load_multiple"])
    times = _poisson_times(rng, n, rate)
    names = ["gold", "silver", "bronze"]
    shares = [0.5, 0.3, 0.2]
    systems = {t: synthetic_text(int(p["system_len"]), rng) for t in names}
    items = []
    for k in range(n):
        tenant = rng.choices(names, weights=[0.3, 0.3, 0.4])[0]
        items.append(
            WorkItem(
                request_id=f"ov-{k}",
                arrival=times[k],
                tenant=tenant,
                messages=_chat(systems[tenant], synthetic_text(int(p["query_len"]), rng)),
                max_tokens=int(p["output_len"]),
                priority_class="batch" if tenant == "bronze" else "interactive",
                group=tenant,
            )
        )
    tenants = {
        t: {"guaranteed_fraction": s * 0.8, "weight": w}
        for t, s, w in zip(names, shares, [3, 2, 1], strict=True)
    }
    return items, {"tenants": tenants}


def _hot_prefix(rng: random.Random, p: dict[str, Any]) -> tuple[list[WorkItem], dict[str, Any]]:
    k_prefixes = int(p["prefixes"])
    prefixes = [synthetic_text(int(p["prefix_len"]), rng) for _ in range(k_prefixes)]
    s = float(p["zipf_s"])
    weights = [1.0 / (i + 1) ** s for i in range(k_prefixes)]
    n = int(p["requests"]) if p.get("requests") else 800
    times = _poisson_times(rng, n, float(p["rate"]))
    picks = rng.choices(range(k_prefixes), weights=weights, k=n)
    return _on_prefixes(rng, p, "hp", prefixes, picks, times, int(p["query_len"]), "p"), {}


# name -> (generator, default parameters, one-line description)
WORKLOADS: dict[str, tuple[Generator, dict[str, Any], str]] = {
    "shared-prefix": (
        _shared_prefix,
        {
            "groups": 64,
            "prompts_per_group": 16,
            "system_len": 2048,
            "question_len": 128,
            "output_len": 256,
            "rate": 16.0,
            "requests": None,
            "cluster_kv_tokens": None,  # None: the profile's KV per node
        },
        "groups x prompts sharing a long system prompt (SGLang generated-shared-prefix shape)",
    ),
    "tenant-prefix": (
        _tenant_prefix,
        {
            "customers": 150,
            "prefix_len": 6000,
            "users_per_customer": 5,
            "query_len": 1200,
            "output_len": 128,
            "rate": 4.0,
            "kv_fraction": 0.73,
            "requests": None,
        },
        "many customers with long private prefixes needing ~73% of cluster KV (llm-d shape)",
    ),
    "multi-turn": (
        _multi_turn,
        {
            "rate": 1.0,
            "mean_turns": 4.0,
            "system_len": 256,
            "user_median": 60,
            "max_user": 1024,
            "output_median": 180,
            "max_output": 1024,
            "think_s": 15.0,
            "est_tpot_s": 0.02,
            "requests": None,
        },
        "conversations whose next turn extends the previous prompt",
    ),
    "tool-agent": (
        _tool_agent,
        {
            "agents": 8,
            "schema_len": 3000,
            "query_min": 20,
            "query_max": 150,
            "output_len": 64,
            "rate": 20.0,
            "requests": None,
        },
        "shared tool-schema prefixes with short varied queries",
    ),
    "long-short-mix": (
        _long_short_mix,
        {
            "long_fraction": 0.1,
            "short_prompt": 200,
            "short_output": 64,
            "long_prompt": 6000,
            "long_output": 512,
            "system_len": 64,
            "rate": 20.0,
            "requests": None,
        },
        "a flood of short requests with some long ones, two tenants (admission)",
    ),
    "overload": (
        _overload,
        {
            "load_multiple": 2.0,
            "rate": 16.0,
            "system_len": 512,
            "query_len": 512,
            "output_len": 256,
            "requests": None,
        },
        "a multiple of capacity from three tenants with different guarantees (admission)",
    ),
    "hot-prefix": (
        _hot_prefix,
        {
            "prefixes": 32,
            "prefix_len": 1024,
            "query_len": 64,
            "output_len": 128,
            "zipf_s": 1.1,
            "rate": 24.0,
            "requests": None,
        },
        "Zipf-skewed prefix popularity",
    ),
    "apps": (generate_apps, APPS_DEFAULTS, APPS_DESCRIPTION),
}
WORKLOADS["daily"] = DAILY
WORKLOAD_NAMES = tuple(WORKLOADS)


def generate_workload(
    name: str,
    *,
    seed: int = 0,
    requests: int | None = None,
    rate: float | None = None,
    **params: Any,
) -> Workload:
    try:
        gen, defaults, _ = WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOAD_NAMES)}") from None
    unknown = set(params) - set(defaults)
    if unknown:
        raise ValueError(f"workload {name}: unknown parameter(s) {sorted(unknown)}")
    p = dict(defaults, **params)
    if requests is not None:
        if requests < 1:
            raise ValueError("requests must be >= 1")
        p["requests"] = requests
    if rate is not None:
        if rate <= 0:
            raise ValueError("rate must be > 0")
        p["rate"] = rate
    rng = random.Random(f"{name}:{seed}")
    items, extra = gen(rng, p)
    tenants = extra.pop("tenants", {})
    p.update(extra)
    return Workload(name=name, seed=seed, params=p, items=items, tenants=tenants)


# The high-load variant of each routing workload: parameters (arrival rate, and enough
# requests for the queue to build) at which round_robin keeps the cluster's prefill at
# ≥ 90% of its capacity (8 nodes, llama3-8b-h100); docs/benchmarks.md "Saturated
# workloads" shows how they were found.
HIGH_LOAD: dict[str, dict[str, Any]] = {
    # 512 groups: round_robin cannot keep every system prompt on every node
    "shared-prefix": {"rate": 160.0, "requests": 3000, "groups": 512, "prompts_per_group": 8},
    "tenant-prefix": {"rate": 36.0, "requests": 3000},
    # long user turns and short think times: histories grow fast while the
    # conversations overlap (a rate alone cannot saturate it: turns wait on think time)
    "multi-turn": {
        "rate": 1000.0,
        "requests": 3000,
        "think_s": 0.3,
        "user_median": 400,
        "max_user": 4096,
    },
    "tool-agent": {"rate": 600.0, "requests": 3000},
    "hot-prefix": {"rate": 700.0, "requests": 3000},
}
LOADS = ("normal", "high")


def load_params(name: str, load: str) -> dict[str, Any]:
    """Workload parameter overrides of a named load level ({} for normal)."""
    if load not in LOADS:
        raise ValueError(f"load must be one of {', '.join(LOADS)}; got {load!r}")
    if load == "normal":
        return {}
    try:
        return dict(HIGH_LOAD[name])
    except KeyError:
        known = ", ".join(sorted(HIGH_LOAD))
        raise ValueError(f"workload {name!r} has no high-load variant; known: {known}") from None


def generate_at_load(
    name: str,
    load: str = "normal",
    *,
    seed: int = 0,
    requests: int | None = None,
    rate: float | None = None,
) -> Workload:
    """A named workload at a named load level; explicit ``requests``/``rate`` win."""
    params = load_params(name, load)
    requests = requests if requests is not None else params.pop("requests", None)
    rate = rate if rate is not None else params.pop("rate", None)
    params.pop("requests", None)
    params.pop("rate", None)
    return generate_workload(name, seed=seed, requests=requests, rate=rate, **params)
