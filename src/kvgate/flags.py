"""Named on/off switches: every strategy has an off switch.

Each flag's text says what turning it off falls back to. The gateway exposes them at
``/admin/flags`` and in the store under ``/kvgate/flags/<name>``; the router, the admission
controller and the simulator read the same ``Flags`` object.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FlagSpec:
    name: str
    off_means: str
    default: bool = True  # strategies are on unless a flag says otherwise


FLAG_SPECS: tuple[FlagSpec, ...] = (
    FlagSpec(
        "cache_affinity",
        "cache signal ignored: hybrid places every request like a new prefix "
        "(fewest prefixes, then least predicted TTFT)",
    ),
    FlagSpec(
        "consistent_hashing",
        "no home node: a new prefix's tie between equally good nodes is broken by traffic, not the ring",
    ),
    FlagSpec("load_guard", "no spill by cost: affinity never leaves a node for its prefill queue"),
    FlagSpec("hit_feedback", "predicted hits are never checked; no (node, prefix) demotion"),
    FlagSpec(
        "eviction_guess",
        "hybrid trusts every index match, even on blocks its per-node LRU shadow says the "
        "engine has evicted",
    ),
    FlagSpec(
        "precise_events",
        "engine KV cache events are ignored; policy precise routes on the approximate index",
    ),
    FlagSpec("cold_boost", "new or re-registered nodes get no routing boost"),
    FlagSpec("retries", "a failed dispatch returns 502 at once"),
    FlagSpec("retry_budget", "retries are limited only by routing.max_retries"),
    FlagSpec(
        "outlier_detection",
        "failing nodes are not ejected; only stale reports take a node out of rotation",
    ),
    FlagSpec("admission", "every request is admitted (no quota, no queue)"),
    FlagSpec(
        "prefill_gate",
        "admissions are not paced by the engines' prefill backlog (only the quota limits them)",
    ),
    FlagSpec(
        "fail_open",
        "admission holds work by its own limits even while every engine reports headroom, "
        "and its limits may shrink while the engines are idle",
    ),
    FlagSpec(
        "queue_shedding",
        "queued work waits until its class deadline even while the queue stands "
        "(engines saturated), instead of a 429 after the class's standing_wait_s",
    ),
    FlagSpec("dynamic_quota", "the cluster total stays at its configured value"),
    FlagSpec("degrade", "over-quota work is queued or rejected, never degraded"),
    FlagSpec(
        "forecast",
        "the dynamic quota reacts to measured load only, not to the forecast",
        default=False,
    ),
)
FLAG_NAMES = frozenset(s.name for s in FLAG_SPECS)
KNOWN_FLAGS = ", ".join(sorted(FLAG_NAMES))  # for messages


def unknown_flags(names: Iterable[str]) -> list[str]:
    return sorted(set(names) - FLAG_NAMES)


def unknown_flags_message(unknown: Iterable[str]) -> str:
    return f"unknown flag(s) {', '.join(unknown)}; known: {KNOWN_FLAGS}"


class UnknownFlag(KeyError):
    pass


class Flags(Mapping[str, bool]):
    """Current flag values."""

    def __init__(self, overrides: Mapping[str, bool] | None = None) -> None:
        self._values = {s.name: s.default for s in FLAG_SPECS}
        for name, value in (overrides or {}).items():
            self.set(name, value)

    def __getitem__(self, name: str) -> bool:
        try:
            return self._values[name]
        except KeyError:
            raise UnknownFlag(name) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def enabled(self, name: str) -> bool:
        return self[name]

    def set(self, name: str, value: bool) -> None:
        if name not in FLAG_NAMES:
            raise UnknownFlag(f"unknown flag {name!r}; known: {KNOWN_FLAGS}")
        self._values[name] = bool(value)

    def as_dict(self) -> dict[str, bool]:
        return dict(self._values)
