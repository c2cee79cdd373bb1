"""The demo's built-in workload: several apps, each with its own long system prompt.

Many users of one app share that app's system prompt (and tool schemas), so its KV
cache can be reused — if requests of one app keep landing on the same nodes. Round-robin
spreads every app over every node, and with the KV cache sized below "all prompts on
every node" each node keeps evicting the prefixes it will need next.

Two tenants: ``interactive`` (chat users, large guarantee) and ``batch`` (long document
jobs in bursts, small guarantee and a hard cap), so admission has something to decide.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kvgate.tokens import synthetic_text


@dataclass(frozen=True, slots=True)
class DemoRequest:
    at_s: float  # offset from the start of the run
    tenant: str
    app: int
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    name: str
    apps: int = 8
    system_tokens: int = 2000
    user_tokens: tuple[int, int] = (20, 80)
    max_tokens: tuple[int, int] = (16, 48)
    rate_per_s: float = 6.0  # interactive arrivals (Poisson)
    batch_every_s: float = 6.0  # a burst of long batch jobs this often
    batch_burst: int = 6
    batch_doc_tokens: int = 800
    app_skew: float = 1.1  # Zipf exponent over apps: a few popular apps, a long tail


WORKLOADS: dict[str, WorkloadSpec] = {
    "shared-prefix": WorkloadSpec("shared-prefix"),
    "light": WorkloadSpec("light", rate_per_s=3.0, batch_burst=3),
}


def system_prompts(spec: WorkloadSpec, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    return [
        f"You are assistant #{i} of the demo company." + synthetic_text(spec.system_tokens, rng)
        for i in range(spec.apps)
    ]


def generate(
    spec: WorkloadSpec, duration_s: float, model: str, seed: int = 11
) -> list[DemoRequest]:
    """The same list for the same arguments: both policies see identical traffic."""
    rng = random.Random(seed)
    prompts = system_prompts(spec)
    weights = [1.0 / (i + 1) ** spec.app_skew for i in range(spec.apps)]
    requests: list[DemoRequest] = []
    t = 0.0
    while True:
        t += rng.expovariate(spec.rate_per_s)
        if t >= duration_s:
            break
        app = rng.choices(range(spec.apps), weights)[0]
        requests.append(DemoRequest(t, "interactive", app, _chat(spec, prompts[app], model, rng)))
    burst_at = spec.batch_every_s / 2
    while burst_at < duration_s:
        for k in range(spec.batch_burst):
            app = rng.randrange(spec.apps)
            body = _chat(spec, prompts[app], model, rng, extra_tokens=spec.batch_doc_tokens)
            requests.append(DemoRequest(burst_at + 0.01 * k, "batch", app, body))
        burst_at += spec.batch_every_s
    requests.sort(key=lambda r: r.at_s)
    return requests


def _chat(
    spec: WorkloadSpec, system: str, model: str, rng: random.Random, extra_tokens: int = 0
) -> dict[str, Any]:
    user = synthetic_text(rng.randint(*spec.user_tokens) + extra_tokens, rng)
    return {
        "model": model,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": rng.randint(*spec.max_tokens),
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def iter_names() -> Iterator[str]:
    return iter(sorted(WORKLOADS))
