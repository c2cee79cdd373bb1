"""Building blocks for admission tests: a core on a ManualClock and a MemoryStore."""

from __future__ import annotations

import itertools
from typing import Any

from kvgate.admission.config import AdmissionConfig
from kvgate.admission.core import AdmissionCore
from kvgate.clock import ManualClock, run_now
from kvgate.flags import Flags
from kvgate.store.memory import MemoryStore
from kvgate.types import AdmissionRequest, AdmissionResult

_ids = itertools.count()


def request(
    tenant: str = "default",
    prompt: int = 100,
    max_tokens: int | None = 100,
    priority_class: str = "interactive",
) -> AdmissionRequest:
    return AdmissionRequest(f"r{next(_ids)}", tenant, priority_class, prompt, max_tokens)


def make_core(
    flags: dict[str, bool] | None = None, **config: Any
) -> tuple[AdmissionCore, ManualClock]:
    clock = ManualClock()
    store = MemoryStore(clock)
    core = AdmissionCore(
        AdmissionConfig(**config), store, flags=Flags(flags or {}), gateway_id="gw-test"
    )
    run_now(store.set_guarantees(core.book.guarantees()))
    return core, clock


def admit(core: AdmissionCore, clock: ManualClock, req: AdmissionRequest) -> AdmissionResult:
    return run_now(core.try_admit(req, clock.now()))


def release(core: AdmissionCore, clock: ManualClock, result: AdmissionResult) -> list[Any]:
    return run_now(core.release(result, clock.now()))
