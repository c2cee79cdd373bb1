"""What both drivers of ``AdmissionCore`` do alike: progress, release and the drain they
call for.

The live ``AdmissionController`` and the simulator's ``VirtualAdmission`` differ only in
how a request waits for its turn; once the core lets a queued request in, each hands it
to ``_resolve`` (the live one completes the waiting future, the virtual one resumes the
simulated request).
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from kvgate.admission.core import AdmissionCore
from kvgate.admission.queue import QueuedRequest
from kvgate.clock import Clock
from kvgate.types import AdmissionResult


class CoreDriver:
    core: AdmissionCore
    clock: Clock

    def _resolve(self, item: QueuedRequest) -> None:
        """A queued request the core has just decided (admitted, or past its deadline)."""
        raise NotImplementedError

    async def progress(self, result: AdmissionResult, generated_tokens: int) -> None:
        pending = self.progress_nowait(result, generated_tokens)
        if pending is not None:
            await pending

    def progress_nowait(
        self, result: AdmissionResult, generated_tokens: int
    ) -> Coroutine[Any, Any, None] | None:
        """``progress``'s bookkeeping, done now; the drain it calls for (the first token
        freed a prefill-gate place), if any, is returned to be awaited."""
        now = self.clock.now()
        # with nothing queued a drain admits nothing (``AdmissionCore.drain``): no
        # coroutine, and no task in the proxy to run it
        if self.core.progress_now(result, generated_tokens, now) and len(self.core.queue):
            return self._drain(now)
        return None

    async def _drain(self, now: float) -> None:
        for item in await self.core.drain(now):
            self._resolve(item)

    async def release(self, result: AdmissionResult) -> None:
        for item in await self.core.release(result, self.clock.now()):
            self._resolve(item)
