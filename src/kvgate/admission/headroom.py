"""Fail-open: admission never holds back work the engines can take.

The prefill gate and the dynamic total are estimates; the engines' own reports say
whether they have room (``pipeline.engine_usage.engines_have_headroom``). When the gate
would hold a request back while every eligible engine has headroom, the request is
admitted instead; when the quota holds one back then, the dynamic quota loop raises the
total at its next check (a configured total is the operator's and is not overruled).
Either hold is counted in ``kvgate_admission_held_with_headroom_total{reason}`` and
logged once per episode. A limit that would shrink while the engines have headroom keeps
its value (``kvgate_admission_shrink_skipped_with_headroom_total{limit}``). Flag
``fail_open`` turns all of it off.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kvgate.admission.config import HeadroomConfig
from kvgate.admission.metrics import AdmissionMetrics
from kvgate.flags import Flags

log = logging.getLogger(__name__)


class HeadroomGuard:
    def __init__(
        self,
        config: HeadroomConfig,
        signal: Callable[[], bool] | None,
        flags: Flags,
        metrics: AdmissionMetrics,
    ) -> None:
        self.config = config
        self.signal = signal
        self.flags = flags
        self.metrics = metrics
        self.held = 0  # holds while the engines had headroom
        self.quota_holds = 0  # of which by the quota (the dynamic loop reads this)
        self._last_hold: float | None = None

    def engines_have_room(self) -> bool:
        """Every eligible engine reports headroom (False without a signal or flag off)."""
        if self.signal is None or not self.flags.enabled("fail_open"):
            return False
        room = self.signal()
        if not room:
            self._last_hold = None  # the engines are busy: this episode is over
        return room

    def engines_saturated(self) -> bool:
        """The engines report no headroom (False without a signal: nothing is known)."""
        return self.signal is not None and not self.signal()

    def overrule(self, reason: str, now: float) -> bool:
        """A limit would hold a request back: True (admit it) while the engines have room."""
        if not self.engines_have_room():
            return False
        self._count(reason, now, "admitting (fail-open)")
        return True

    def note_hold(self, reason: str, now: float) -> bool:
        """The quota held a request back: counted (True) while the engines have room."""
        if not self.engines_have_room():
            return False
        self._count(reason, now, "the dynamic quota raises the total")
        self.quota_holds += 1
        return True

    def _count(self, reason: str, now: float, action: str) -> None:
        self.held += 1
        self.metrics.held_with_headroom.labels(reason).inc()
        if self._last_hold is None or now - self._last_hold > self.config.episode_gap_s:
            log.warning(
                "admission: the %s would hold work back while every eligible engine has "
                "headroom; %s. Counted in kvgate_admission_held_with_headroom_total; "
                "flag fail_open=off disables this",
                reason,
                action,
            )
        self._last_hold = now

    def may_shrink(self, limit: str) -> bool:
        """False (and counted) when ``limit`` would shrink while the engines have room."""
        if not self.engines_have_room():
            return True
        self.metrics.shrink_skipped.labels(limit).inc()
        return False
