"""Per-tenant admission queues, dequeued by deficit round-robin in token units.

Each tenant with backlog earns ``quantum * weight`` tokens of credit per round; its head
request is tried when the credit covers it. Long requests (at or above the threshold)
are protected by the core: while one waits, short requests may not use the reserved
fraction of the elastic pool, and once a long request's credit covers it (it is *due*)
short ones are held back until it fits.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from kvgate.types import AdmissionRequest


@dataclass(eq=False, slots=True)
class QueuedRequest:
    request: AdmissionRequest
    tokens: int  # the reservation it needs
    enqueued_at: float
    deadline: float
    is_long: bool
    degrade_to: str | None = None  # async work waits here too; it is dispatched from here
    sheds: bool = False  # its deadline is the standing-queue wait: expiring is "overloaded"
    handle: Any = None  # the live controller's future
    outcome: Any = None  # set when admitted or expired (an AdmissionResult)

    @property
    def tenant(self) -> str:
        return self.request.tenant


@dataclass(slots=True)
class _TenantQueue:
    items: deque[QueuedRequest] = field(default_factory=deque)
    tokens: int = 0
    deficit: float = 0.0
    backlog_since: float | None = None  # when it last went from empty to non-empty


class AdmissionQueue:
    def __init__(
        self,
        *,
        max_tokens_per_tenant: int,
        quantum_tokens: int,
        weight: Callable[[str], float],
        long_threshold: int = 2048,
    ) -> None:
        self.long_threshold = long_threshold
        self._max_tokens = max_tokens_per_tenant
        self._quantum = quantum_tokens
        self._weight = weight
        self._queues: dict[str, _TenantQueue] = {}
        self.due_long: QueuedRequest | None = None

    def can_accept(self, tenant: str, tokens: int) -> bool:
        q = self._queues.get(tenant)
        queued = q.tokens if q else 0
        return queued + tokens <= self._max_tokens

    def push(self, item: QueuedRequest) -> None:
        q = self._queues.setdefault(item.tenant, _TenantQueue())
        if not q.items:
            q.backlog_since = item.enqueued_at
        q.items.append(item)
        q.tokens += item.tokens

    def backlog_since(self, tenant: str) -> float | None:
        """Since when ``tenant``'s queue has had work in it without a break; None if empty."""
        q = self._queues.get(tenant)
        return q.backlog_since if q is not None and q.items else None

    def _pop_head(self, q: _TenantQueue) -> QueuedRequest:
        item = q.items.popleft()
        q.tokens -= item.tokens
        return item

    def remove(self, item: QueuedRequest) -> bool:
        q = self._queues.get(item.tenant)
        if q is None or item not in q.items:
            return False
        q.items.remove(item)
        q.tokens -= item.tokens
        if self.due_long is item:
            self.due_long = None
        return True

    def contains(self, item: QueuedRequest) -> bool:
        q = self._queues.get(item.tenant)
        return q is not None and item in q.items

    def depth(self, tenant: str) -> int:
        q = self._queues.get(tenant)
        return len(q.items) if q else 0

    def queued_tokens(self, tenant: str | None = None) -> int:
        if tenant is not None:
            q = self._queues.get(tenant)
            return q.tokens if q else 0
        return sum(q.tokens for q in self._queues.values())

    def has_backlog(self, tenant: str) -> bool:
        return self.depth(tenant) > 0

    def waiting_tenants(self) -> set[str]:
        return {t for t, q in self._queues.items() if q.items}

    def long_waiting(self) -> bool:
        return any(i.is_long for q in self._queues.values() for i in q.items)

    def held_back_for_long(self, tokens: int, total: int, reserved_fraction: float) -> int:
        """Elastic tokens a short request may not take, so long ones are not starved:
        a reserved fraction while one waits, its full size once it is due."""
        if tokens >= self.long_threshold:
            return 0
        held_back = int(reserved_fraction * total) if self.long_waiting() else 0
        if self.due_long is not None:
            held_back = max(held_back, self.due_long.tokens)
        return held_back

    def __len__(self) -> int:
        return sum(len(q.items) for q in self._queues.values())

    def expire(self, now: float) -> list[QueuedRequest]:
        """Remove and return requests whose deadline has passed (deadline <= now)."""
        expired: list[QueuedRequest] = []
        for q in self._queues.values():
            keep: deque[QueuedRequest] = deque()
            for item in q.items:
                (expired if item.deadline <= now else keep).append(item)
            q.items = keep
            q.tokens = sum(i.tokens for i in keep)
        if self.due_long is not None and self.due_long in expired:
            self.due_long = None
        return expired

    def next_deadline(self) -> float | None:
        deadlines = [i.deadline for q in self._queues.values() for i in q.items]
        return min(deadlines) if deadlines else None

    async def drain(
        self, attempt: Callable[[QueuedRequest], Awaitable[bool]]
    ) -> list[QueuedRequest]:
        """Admit queued requests in DRR order while ``attempt`` (a reservation) succeeds."""
        admitted: list[QueuedRequest] = []
        self.due_long = None
        while True:
            progress = False
            accumulating = False
            for tenant, q in list(self._queues.items()):
                if not q.items:
                    q.deficit = 0.0
                    continue
                q.deficit += self._quantum * self._weight(tenant)
                while q.items and q.deficit >= q.items[0].tokens:
                    head = q.items[0]
                    if not await attempt(head):
                        if head.is_long and self.due_long is None and self.contains(head):
                            self.due_long = head
                        break
                    if not q.items or q.items[0] is not head:
                        continue  # removed while the store answered (attempt undid it)
                    self._pop_head(q)
                    q.deficit -= head.tokens
                    admitted.append(head)
                    progress = True
                    if self.due_long is head:
                        self.due_long = None
                if not q.items:
                    q.deficit = 0.0
                else:
                    head_tokens = q.items[0].tokens
                    if q.deficit < head_tokens:
                        accumulating = True
                    # credit never grows past what the head needs: no hoarding
                    q.deficit = min(q.deficit, max(head_tokens, self._quantum))
            if not progress and not accumulating:
                return admitted
