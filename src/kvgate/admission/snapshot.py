"""The admission state as plain data (``/admin/summary``, the dashboard, ``kvgate status``)."""

from __future__ import annotations

from typing import Any, Protocol

from kvgate.admission.decisions import DecisionCounter
from kvgate.admission.ledger import Ledger
from kvgate.admission.overcommit import Overcommit
from kvgate.admission.queue import AdmissionQueue
from kvgate.admission.quota_book import QuotaBook
from kvgate.admission.store_link import StoreLink
from kvgate.flags import Flags


class AdmissionParts(Protocol):
    """The parts of an admission core that its snapshot reads."""

    flags: Flags
    book: QuotaBook
    link: StoreLink
    ledger: Ledger
    queue: AdmissionQueue
    overcommit: Overcommit
    decisions: DecisionCounter


def snapshot(core: AdmissionParts) -> dict[str, Any]:
    usage = {t: u for t, u in core.link.usage.items() if u}
    by_mode = core.ledger.reserved_by()
    tenants = {
        name: {
            "guaranteed": q.guaranteed,
            "weight": q.weight,
            "hard_cap": q.hard_cap,
            "used": usage.get(name, 0),
            "degraded_reserved": sum(
                v for (t, m), v in by_mode.items() if t == name and m != "normal"
            ),
            "queue_depth": core.queue.depth(name),
            "queued_tokens": core.queue.queued_tokens(name),
        }
        for name, q in sorted(core.book.quotas.items())
    }
    return {
        "enabled": core.flags.enabled("admission"),
        "total_quota": core.book.total,
        "overcommit": core.overcommit.effective,
        "used": sum(usage.values()),
        "local_reserved": core.ledger.reserved_total,
        "runtime_tokens": core.ledger.held_total,
        "watermark": core.ledger.watermark(),
        "in_flight": len(core.ledger),
        "queue_depth": len(core.queue),
        "tenants": tenants,
        "decisions_total": core.decisions.as_dict(),
        "store": {"url": core.link.store.url, "up": core.link.up},
    }
