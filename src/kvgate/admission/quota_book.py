"""The live quotas: the cluster total and each tenant's guarantee, weight and hard cap.

Config gives the start; /kvgate/global/quota/total and /kvgate/tenant/<name>/quota in
the store override it at run time (watched by the live controller).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from kvgate.admission.config import AdmissionConfig
from kvgate.admission.metrics import AdmissionMetrics
from kvgate.admission.quota import TenantQuota
from kvgate.store.keys import TENANTS_PREFIX, TOTAL_QUOTA

log = logging.getLogger("kvgate.admission")


class QuotaBook:
    def __init__(self, config: AdmissionConfig, metrics: AdmissionMetrics) -> None:
        self._absolute_hard_cap = config.absolute_hard_cap
        self._metrics = metrics
        self.quotas: dict[str, TenantQuota] = {
            t.name: TenantQuota.from_config(t, config.total_quota) for t in config.tenants
        }
        self.total = config.total_quota
        self.guarantees_changed = True  # the store must learn them before the first reserve
        metrics.quota_total.set(self.total)
        for q in self.quotas.values():
            metrics.quota_guaranteed.labels(q.name).set(q.guaranteed)

    def quota_for(self, tenant: str) -> TenantQuota:
        q = self.quotas.get(tenant)
        if q is None:
            q = self.quotas[tenant] = TenantQuota(tenant, 0, 1.0, None)
        return q

    def set_total(self, total: int) -> None:
        cap = self._absolute_hard_cap
        self.total = max(1, min(total, cap) if cap is not None else total)
        self._metrics.quota_total.set(self.total)
        for q in self.quotas.values():
            if q.fraction is not None:
                q.guaranteed = int(q.fraction * self.total)
                self._metrics.quota_guaranteed.labels(q.name).set(q.guaranteed)
                self.guarantees_changed = True

    def guarantees(self) -> dict[str, int]:
        return {n: q.guaranteed for n, q in self.quotas.items()}

    def apply_store_value(self, key: str, value: str | None) -> bool:
        """Apply a /kvgate/global/quota/total or /kvgate/tenant/<name>/quota value."""
        try:
            if key == TOTAL_QUOTA and value is not None:
                self.set_total(int(float(value)))
                return True
            if key.startswith(TENANTS_PREFIX) and key.endswith("/quota") and value is not None:
                name = key[len(TENANTS_PREFIX) : -len("/quota")]
                data: dict[str, Any] = json.loads(value)
                q = self.quota_for(name)
                q.guaranteed = int(data.get("guaranteed", q.guaranteed))
                q.weight = float(data.get("weight", q.weight))
                cap = data.get("hard_cap", q.hard_cap)
                q.hard_cap = None if cap is None else int(cap)
                q.fraction = None
                self._metrics.quota_guaranteed.labels(name).set(q.guaranteed)
                self.guarantees_changed = True
                return True
        except (ValueError, TypeError) as exc:
            log.warning("ignoring bad quota value at %s: %s", key, exc)
        return False
