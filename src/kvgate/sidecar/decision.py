"""What state a sidecar asks the gateway to hold its node in — pure, clock-injected.

``NodeStateDecider.observe(raw, smoothed)`` is called once per scrape with the adapter's
report and the sliding-window view of it, and returns the ``NodeState`` to publish:

* ``unreachable`` — the engine has not answered a scrape for ``unreachable_after_s``;
* ``re-register`` — the engine restarted (counters went backwards or its process start
  time changed); held for ``reregister_hold_s`` so the gateway sees it, purges the node's
  prefix-index entries and applies the cold boost;
* ``backoff`` — saturated: the (smoothed) waiting queue or KV usage crossed its high
  mark, or preemptions rose; released only after every signal has stayed below its low
  mark for ``recover_hold_s`` (hysteresis in level and in time, so it does not flap);
* ``quiescing`` — after ``begin_drain()``, until the sidecar deregisters;
* ``healthy`` otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvgate.clock import Clock
from kvgate.types import NodeReport, NodeState


@dataclass(frozen=True, slots=True)
class SaturationPolicy:
    waiting_high: float = 8.0  # enter backoff at this many queued requests…
    waiting_low: float = 2.0  # …and leave it only at or below this many
    kv_high: float = 0.95  # KV usage fraction to enter backoff
    kv_low: float = 0.85
    preemptions_high: float = 1.0  # preemptions within one scrape that count as saturation
    recover_hold_s: float = 10.0  # calm needed before going back to healthy
    reregister_hold_s: float = 6.0
    unreachable_after_s: float = 6.0

    def __post_init__(self) -> None:
        for name in ("waiting_high", "waiting_low", "kv_high", "kv_low", "preemptions_high"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if self.waiting_low > self.waiting_high:
            raise ValueError("waiting_low must not exceed waiting_high")
        if self.kv_low > self.kv_high:
            raise ValueError("kv_low must not exceed kv_high")
        for name in ("recover_hold_s", "reregister_hold_s", "unreachable_after_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")


class NodeStateDecider:
    def __init__(self, clock: Clock, policy: SaturationPolicy | None = None) -> None:
        self.clock = clock
        self.policy = policy or SaturationPolicy()
        self.state = NodeState.HEALTHY
        self.draining = False
        self.restarts = 0
        self._backoff = False
        self._calm_since: float | None = None
        self._restart_at: float | None = None
        self._last_ok_at: float | None = None
        self._last_preemptions: float | None = None
        self._last_raw: NodeReport | None = None

    # ---- inputs --------------------------------------------------------------------

    def begin_drain(self) -> None:
        self.draining = True
        self.state = NodeState.QUIESCING

    def observe(self, raw: NodeReport, smoothed: NodeReport | None = None) -> NodeState:
        now = self.clock.now()
        smoothed = smoothed or raw
        self._last_raw = raw
        if raw.stale:
            self.state = self._decide_stale(now)
            return self.state
        self._last_ok_at = now
        if raw.counters_reset:
            self.restarts += 1
            self._restart_at = now
            # A restarted engine starts empty: saturation history no longer applies.
            self._backoff = False
            self._calm_since = None
            self._last_preemptions = None
        self._update_saturation(raw, smoothed, now)
        self.state = self._decide(now)
        return self.state

    # ---- outputs -------------------------------------------------------------------

    @property
    def drained(self) -> bool:
        """In-flight work is done: the last scrape succeeded and showed nothing running or queued."""
        raw = self._last_raw
        return raw is not None and not raw.stale and raw.running + raw.waiting <= 0

    @property
    def saturated(self) -> bool:
        return self._backoff

    # ---- internals -----------------------------------------------------------------

    def _decide_stale(self, now: float) -> NodeState:
        if self.draining:
            return NodeState.QUIESCING
        if self._last_ok_at is None or now - self._last_ok_at >= self.policy.unreachable_after_s:
            return NodeState.UNREACHABLE
        return self.state

    def _decide(self, now: float) -> NodeState:
        if self.draining:
            return NodeState.QUIESCING
        if self._restart_at is not None:
            if now - self._restart_at < self.policy.reregister_hold_s:
                return NodeState.REREGISTER
            self._restart_at = None
        if self._backoff:
            return NodeState.BACKOFF
        return NodeState.HEALTHY

    def _update_saturation(self, raw: NodeReport, smoothed: NodeReport, now: float) -> None:
        p = self.policy
        preempted = 0.0
        if self._last_preemptions is not None:
            preempted = max(0.0, raw.preemptions_total - self._last_preemptions)
        self._last_preemptions = raw.preemptions_total
        # Gauges from the smoothed view: one spiky scrape is not saturation.
        waiting = smoothed.waiting
        hot = (
            waiting >= p.waiting_high
            or smoothed.kv_usage >= p.kv_high
            or (p.preemptions_high > 0 and preempted >= p.preemptions_high)
        )
        if hot:
            self._backoff = True
            self._calm_since = None
            return
        if not self._backoff:
            return
        calm = waiting <= p.waiting_low and smoothed.kv_usage <= p.kv_low and preempted == 0
        if not calm:
            self._calm_since = None
            return
        if self._calm_since is None:
            self._calm_since = now
        if now - self._calm_since >= p.recover_hold_s:
            self._backoff = False
            self._calm_since = None
