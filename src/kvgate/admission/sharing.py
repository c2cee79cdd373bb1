"""How many reserved (and held) tokens the engines need per KV token they actually use.

Reservations count each request's whole prompt and output bound; the engines hold a
shared prefix once and only the tokens generated so far. A total bounded by raw KV
capacity in reservation units therefore caps a cluster that shares long system prompts
far below what its engines can hold. The ratio is measured every quota check from the
engines' reported KV use and smoothed; 1.0 until both sides have enough to compare.
"""

from __future__ import annotations

# below this many engine-reported tokens the ratio is noise (a block or two in use)
MIN_ENGINE_TOKENS = 1024
MAX_RATIO = 16.0
SMOOTHING = 0.3


class SharingRatio:
    def __init__(self) -> None:
        self.reserved_per_engine_token = 1.0
        self.held_per_engine_token = 1.0
        self.measured = False  # True once both sides were compared

    def observe(self, reserved: int, held: int, engine_tokens: int | None) -> None:
        if engine_tokens is None or engine_tokens < MIN_ENGINE_TOKENS or reserved <= 0:
            return
        res = min(MAX_RATIO, max(1.0, reserved / engine_tokens))
        hld = min(MAX_RATIO, max(1.0, held / engine_tokens))
        if not self.measured:
            self.reserved_per_engine_token, self.held_per_engine_token = res, hld
            self.measured = True
            return
        a = SMOOTHING
        self.reserved_per_engine_token += a * (res - self.reserved_per_engine_token)
        self.held_per_engine_token += a * (hld - self.held_per_engine_token)
