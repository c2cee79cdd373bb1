"""Results of async jobs (``Prefer: respond-async`` → 202 + Location: /v1/jobs/{id})."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from kvgate.clock import Clock


@dataclass(slots=True)
class Job:
    job_id: str
    tenant: str
    created_at: float
    status: int | None = None  # HTTP status of the finished request; None while pending
    body: Any = None
    finished_at: float | None = None


class JobStore:
    """Jobs kept in process; a finished job's result lives for ``ttl_s`` then vanishes."""

    def __init__(self, clock: Clock, ttl_s: float = 3600.0, max_pending_s: float = 86400.0):
        self._clock = clock
        self._ttl_s = ttl_s
        self._max_pending_s = max_pending_s
        self._jobs: dict[str, Job] = {}

    def create(self, tenant: str) -> str:
        self._expire()
        job_id = f"job-{secrets.token_hex(12)}"
        self._jobs[job_id] = Job(job_id, tenant, self._clock.now())
        return job_id

    def set_result(self, job_id: str, status: int, body: Any) -> None:
        job = self._jobs.get(job_id)
        if job is None:
            return
        job.status, job.body, job.finished_at = status, body, self._clock.now()

    def get(self, job_id: str, tenant: str) -> Job | None:
        """The job if it exists, is not expired and belongs to ``tenant``."""
        self._expire()
        job = self._jobs.get(job_id)
        if job is None or job.tenant != tenant:
            return None
        return job

    def __len__(self) -> int:
        self._expire()
        return len(self._jobs)

    def _expire(self) -> None:
        now = self._clock.now()
        dead = [
            jid
            for jid, j in self._jobs.items()
            if (j.finished_at is not None and now - j.finished_at >= self._ttl_s)
            or (j.finished_at is None and now - j.created_at >= self._max_pending_s)
        ]
        for jid in dead:
            del self._jobs[jid]
