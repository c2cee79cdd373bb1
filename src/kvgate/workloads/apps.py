"""The ``apps`` workload: several apps, each with its own long system prompt.

Many users of one app share that app's system prompt, so its KV cache can be reused — if
requests of one app keep landing on the same nodes. App popularity is Zipf-skewed: a few
popular apps and a long tail. Two tenants give admission something to decide:
``interactive`` (chat users, Poisson arrivals, large guarantee) and ``batch`` (bursts of
long document jobs, small guarantee). ``kvgate demo`` replays it live.
"""

from __future__ import annotations

import random
from typing import Any

from kvgate.tokens import synthetic_text
from kvgate.workloads.base import WorkItem

DEFAULTS: dict[str, Any] = {
    "duration_s": 25.0,  # arrivals until this time (``requests`` caps the count)
    "rate": 6.0,  # interactive arrivals per second
    "apps": 8,
    "system_len": 2000,
    "user_len_min": 20,
    "user_len_max": 80,
    "output_min": 16,
    "output_max": 48,
    "app_skew": 1.1,  # Zipf exponent over apps
    "batch_every_s": 6.0,  # a burst of batch jobs this often (the first at half of it)
    "batch_burst": 6,
    "batch_doc_len": 800,  # extra user tokens of a batch job
    "requests": None,
}
DESCRIPTION = "apps with long system prompts (Zipf popularity), interactive + batch tenants"
TENANTS = {
    "interactive": {"guaranteed_fraction": 0.56, "weight": 3},
    "batch": {"guaranteed_fraction": 0.125, "weight": 1},
}


def generate_apps(rng: random.Random, p: dict[str, Any]) -> tuple[list[WorkItem], dict[str, Any]]:
    apps, duration = int(p["apps"]), float(p["duration_s"])
    systems = [
        f"You are assistant #{i} of the demo company." + synthetic_text(int(p["system_len"]), rng)
        for i in range(apps)
    ]
    weights = [1.0 / (i + 1) ** float(p["app_skew"]) for i in range(apps)]

    def item(at: float, tenant: str, app: int, extra: int) -> WorkItem:
        user_len = rng.randint(int(p["user_len_min"]), int(p["user_len_max"])) + extra
        return WorkItem(
            request_id="",  # numbered in arrival order below
            arrival=at,
            tenant=tenant,
            messages=[
                {"role": "system", "content": systems[app]},
                {"role": "user", "content": synthetic_text(user_len, rng)},
            ],
            max_tokens=rng.randint(int(p["output_min"]), int(p["output_max"])),
            priority_class="batch" if tenant == "batch" else "interactive",
            group=f"app{app}",
        )

    items: list[WorkItem] = []
    t = rng.expovariate(float(p["rate"]))
    while t < duration:
        items.append(item(t, "interactive", rng.choices(range(apps), weights)[0], 0))
        t += rng.expovariate(float(p["rate"]))
    every = float(p["batch_every_s"])
    burst_at = every / 2
    while burst_at < duration:
        for k in range(int(p["batch_burst"])):
            items.append(
                item(burst_at + 0.01 * k, "batch", rng.randrange(apps), int(p["batch_doc_len"]))
            )
        burst_at += every
    items.sort(key=lambda w: w.arrival)
    if p.get("requests"):
        items = items[: int(p["requests"])]
    for k, w in enumerate(items):
        w.request_id = f"app-{k}"
    return items, {"tenants": TENANTS}
