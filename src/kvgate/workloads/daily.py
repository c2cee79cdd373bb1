"""A daily-shaped arrival rate over several (compressed) days, for the forecast.

The rate follows a working day: a night floor, a morning peak around 11:00, a lunch dip
and an afternoon peak around 15:30, then the evening decline:

    shape(h) = max(night, 0.95·g(h; 11, 2.2) + 1.0·g(h; 15.5, 2.4)),  g = Gaussian bump

``rate(t) = peak_rate · shape(hour of t)``, scaled per day by ``1 ± day_jitter`` so no
two days are identical. A day lasts ``day_s`` seconds of simulated time (compressed:
``sample_s`` is the forecaster's "minute", ``day_s / sample_s`` samples a season).
Arrivals are a non-homogeneous Poisson process (thinning). Two tenants: ``app``
(interactive, 75%) and ``batch`` (25%), each with its own shared system prompt.
"""

from __future__ import annotations

import math
import random
from typing import Any

from kvgate.tokens import synthetic_text
from kvgate.workloads.base import WorkItem

DEFAULTS: dict[str, Any] = {
    "days": 2,
    "day_s": 7200.0,  # one simulated day
    "sample_s": 60.0,  # the forecaster's minute: 120 samples a day
    "peak_rate": 1.5,  # arrivals/s at the top of the afternoon peak
    "night": 0.08,  # night floor as a fraction of the peak
    "day_jitter": 0.05,
    "system_len": 512,
    "query_len": 256,
    "output_len": 256,
    "rate": None,  # --rate sets peak_rate
    "requests": None,  # --requests caps the count
}


def shape(hour: float, night: float) -> float:
    def bump(mu: float, sigma: float) -> float:
        return math.exp(-0.5 * ((hour - mu) / sigma) ** 2)

    return max(night, min(1.0, 0.95 * bump(11.0, 2.2) + 1.0 * bump(15.5, 2.4)))


def rate_at(t: float, p: dict[str, Any], day_scale: list[float]) -> float:
    day = int(t // float(p["day_s"]))
    hour = 24.0 * (t % float(p["day_s"])) / float(p["day_s"])
    scale = day_scale[min(day, len(day_scale) - 1)]
    return float(p["peak_rate"]) * scale * shape(hour, float(p["night"]))


def generate(rng: random.Random, p: dict[str, Any]) -> tuple[list[WorkItem], dict[str, Any]]:
    if p.get("rate"):
        p["peak_rate"] = float(p["rate"])
    days, day_s = int(p["days"]), float(p["day_s"])
    jitter = float(p["day_jitter"])
    day_scale = [1.0 + rng.uniform(-jitter, jitter) for _ in range(days)]
    top = float(p["peak_rate"]) * max(day_scale)
    systems = {
        "app": synthetic_text(int(p["system_len"]), rng),
        "batch": synthetic_text(int(p["system_len"]), rng),
    }
    limit = int(p["requests"]) if p.get("requests") else None
    items: list[WorkItem] = []
    t = 0.0
    while True:
        t += rng.expovariate(top)
        if t >= days * day_s or (limit is not None and len(items) >= limit):
            break
        if rng.random() * top > rate_at(t, p, day_scale):
            continue  # thinning: keep with probability rate(t) / top
        tenant = "app" if rng.random() < 0.75 else "batch"
        items.append(
            WorkItem(
                request_id=f"day-{len(items)}",
                arrival=t,
                tenant=tenant,
                messages=[
                    {"role": "system", "content": systems[tenant]},
                    {"role": "user", "content": synthetic_text(int(p["query_len"]), rng)},
                ],
                max_tokens=int(p["output_len"]),
                priority_class="batch" if tenant == "batch" else "interactive",
                group=tenant,
            )
        )
    tenants = {
        "app": {"guaranteed_fraction": 0.5, "weight": 3},
        "batch": {"guaranteed_fraction": 0.1, "weight": 1},
    }
    return items, {"tenants": tenants, "day_scale": day_scale}


ENTRY = (
    generate,
    DEFAULTS,
    "a daily-shaped rate (morning and afternoon peaks) over several compressed days (forecast)",
)
