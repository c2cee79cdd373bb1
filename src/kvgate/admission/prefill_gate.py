"""The prefill gate: paces admissions by the prefill backlog they leave on the engines.

The total bounds the runtime tokens in flight, not how fast they arrive: after a quiet
start or a raise, a total's worth of requests is admitted within a second and the
engines prefill it for several seconds, so every first token in that burst misses the
interactive SLO. The gate bounds the *pending prefill*: prompt tokens of admitted
streams whose first token has not come. A request that would take it over the limit
waits in the admission queue (one request is always let in when nothing is pending).

The limit follows the engines' measured prefill speed (Little's law, pending = rate ×
latency): every ``adapt_s`` it is scaled by ``target_s`` over the admission → first
token percentile seen since the last step (pending requests count their age), by at
most ``max_growth`` either way, and only grown while the gate held work back (an idle
gate says nothing about the engines). While ``engines_idle()`` (every eligible engine
reports headroom: admission.headroom) it does not shrink, and a limit that shrank below
``initial_tokens`` goes back to it: whatever slowed the first tokens has passed. Classes
not listed in ``priority_classes`` may fill only ``other_share`` of the limit, so
interactive work finds room first.
Non-streamed requests report no first token and pass the gate without being counted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvgate.admission.config import PrefillGateConfig
from kvgate.admission.metrics import AdmissionMetrics


@dataclass(slots=True)
class _Pending:
    prompt_tokens: int
    admitted_at: float


class PrefillGate:
    def __init__(
        self,
        config: PrefillGateConfig,
        metrics: AdmissionMetrics,
        engines_idle: Callable[[], bool] | None = None,
    ) -> None:
        self.config = config
        self.engines_idle = engines_idle
        self.metrics = metrics
        self.limit = float(config.initial_tokens)
        self.pending_tokens = 0
        self._pending: dict[str, _Pending] = {}
        self._latencies: list[float] = []  # admission → first token since the last step
        self._held = False  # the gate held work back since the last step
        self._stepped_at: float | None = None
        metrics.prefill_limit.set(self.limit)

    def allows(self, prompt_tokens: int, priority_class: str) -> bool:
        if not self._pending:
            return True
        share = 1.0 if priority_class in self.config.priority_classes else self.config.other_share
        if self.pending_tokens + prompt_tokens <= self.limit * share:
            return True
        self._held = True
        return False

    def admitted(self, request_id: str, prompt_tokens: int, now: float, stream: bool) -> None:
        if not stream:
            return
        self._pending[request_id] = _Pending(prompt_tokens, now)
        self.pending_tokens += prompt_tokens
        self.metrics.prefill_pending.set(self.pending_tokens)

    def first_token(self, request_id: str, now: float) -> bool:
        """The request's first token came: its prefill left the backlog. True if it was
        pending (the gate has room again: the caller drains the queue)."""
        entry = self._forget(request_id)
        if entry is None:
            return False
        self._latencies.append(now - entry.admitted_at)
        self.adapt(now)
        return True

    def closed(self, request_id: str) -> bool:
        """Released (or failed) before any first token."""
        return self._forget(request_id) is not None

    def _forget(self, request_id: str) -> _Pending | None:
        entry = self._pending.pop(request_id, None)
        if entry is not None:
            self.pending_tokens -= entry.prompt_tokens
            self.metrics.prefill_pending.set(self.pending_tokens)
        return entry

    def adapt(self, now: float) -> None:
        """Once per ``adapt_s``: scale the limit by target / observed latency."""
        cfg = self.config
        if self._stepped_at is None:
            self._stepped_at = now
        if now - self._stepped_at < cfg.adapt_s:
            return
        seen = self._latencies + [now - p.admitted_at for p in self._pending.values()]
        if len(seen) < cfg.min_samples:
            return  # keep gathering
        self._stepped_at = now
        held, self._held, self._latencies = self._held, False, []
        seen.sort()
        observed = seen[min(len(seen) - 1, int(cfg.percentile / 100 * len(seen)))]
        factor = cfg.target_s / max(observed, 1e-6)
        if self.engines_idle is not None and self.engines_idle():
            if factor < 1.0:
                self.metrics.shrink_skipped.labels("prefill_gate").inc()
                factor = 1.0
            if self.limit < cfg.initial_tokens:
                self.limit = float(cfg.initial_tokens)
                self.metrics.prefill_limit.set(self.limit)
        if factor == 1.0 or (factor > 1.0 and not held):
            return
        factor = min(cfg.max_growth, max(1.0 / cfg.max_growth, factor))
        self.limit = min(float(cfg.max_tokens), max(float(cfg.min_tokens), self.limit * factor))
        self.metrics.prefill_limit.set(self.limit)
