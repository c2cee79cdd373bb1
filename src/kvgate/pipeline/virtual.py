"""The quota layer in virtual time: ``AdmissionCore`` behind the pipeline's Admission.

The live ``AdmissionController`` waits for a queued request's turn; in virtual time
nothing waits, so ``admit`` returns QUEUE and the simulator resumes the request (through
``on_admitted``) when a release or a quota step lets it in. Its coroutines never suspend
over the in-memory store, so ``kvgate.clock.run_now`` drives them.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from kvgate.admission.core import AdmissionCore
from kvgate.admission.queue import QueuedRequest
from kvgate.clock import Clock
from kvgate.types import AdmissionRequest, AdmissionResult


class VirtualAdmission:
    def __init__(
        self,
        core: AdmissionCore,
        clock: Clock,
        on_admitted: Callable[[QueuedRequest], None],
    ) -> None:
        self.core = core
        self.clock = clock
        self.on_admitted = on_admitted

    async def admit(self, req: AdmissionRequest) -> AdmissionResult:
        return await self.core.try_admit(req, self.clock.now())

    async def progress(self, result: AdmissionResult, generated_tokens: int) -> None:
        pending = self.progress_nowait(result, generated_tokens)
        if pending is not None:
            await pending

    def progress_nowait(
        self, result: AdmissionResult, generated_tokens: int
    ) -> Coroutine[Any, Any, None] | None:
        now = self.clock.now()
        if self.core.progress_now(result, generated_tokens, now):
            return self._drain(now)
        return None

    async def _drain(self, now: float) -> None:
        for item in await self.core.drain(now):
            self.on_admitted(item)

    async def release(self, result: AdmissionResult) -> None:
        for item in await self.core.release(result, self.clock.now()):
            self.on_admitted(item)
