"""The quota layer in virtual time: ``AdmissionCore`` behind the pipeline's Admission.

The live ``AdmissionController`` waits for a queued request's turn; in virtual time
nothing waits, so ``admit`` returns QUEUE and the simulator resumes the request (through
``on_admitted``) when a release or a quota step lets it in. Its coroutines never suspend
over the in-memory store, so ``kvgate.clock.run_now`` drives them.
"""

from __future__ import annotations

from collections.abc import Callable

from kvgate.admission.core import AdmissionCore
from kvgate.admission.driver import CoreDriver
from kvgate.admission.queue import QueuedRequest
from kvgate.clock import Clock
from kvgate.types import AdmissionRequest, AdmissionResult


class VirtualAdmission(CoreDriver):
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

    def _resolve(self, item: QueuedRequest) -> None:
        self.on_admitted(item)
