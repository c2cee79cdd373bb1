"""Global admission control: runtime-token ledger, tenant quotas, queue, degrade.

``AdmissionCore`` (core.py) holds the decision logic, clock-injected and free of asyncio
waits; ``AdmissionController`` (controller.py) wraps it for the live gateway.
"""

from kvgate.admission.config import AdmissionConfig, TenantConfig

__all__ = ["AdmissionConfig", "TenantConfig"]
