"""API key → tenant, and the classes and priority range that key may ask for.

The key decides: a request header (X-KVGate-Class, X-KVGate-Priority) may only choose
within what the tenant's config allows; anything else is refused (the gateway answers
403), never silently widened.
"""

from __future__ import annotations

from kvgate.admission.config import AdmissionConfig, TenantConfig


class NotAllowed(ValueError):
    """A client asked for a class or priority its key does not allow."""


class PriorityNotAllowed(NotAllowed):
    """A priority outside the tenant's priority_min..priority_max."""


class ClassNotAllowed(NotAllowed):
    """A priority class not in the tenant's classes."""


def allowed_classes(tenant: TenantConfig) -> list[str]:
    return list(tenant.classes) if tenant.classes else [tenant.default_class]


class TenantDirectory:
    def __init__(self, config: AdmissionConfig) -> None:
        self._config = config
        self._by_key = {key: t for t in config.tenants for key in t.api_keys}
        self._by_name = {t.name: t for t in config.tenants}
        self.auth_enabled = bool(self._by_key)
        default = config.default_tenant
        self.default = self._by_name.get(default) or TenantConfig(name=default)

    def authenticate(self, api_key: str | None) -> TenantConfig | None:
        """The key's tenant; None for an unknown or missing key (→ 401) when auth is on."""
        if not self.auth_enabled:
            return self.default
        if api_key is None:
            return None
        return self._by_key.get(api_key)

    def get(self, name: str) -> TenantConfig | None:
        return self._by_name.get(name)

    def resolve_priority(self, tenant: TenantConfig, requested: int | None) -> int:
        if requested is None:
            if tenant.default_priority is not None:
                return tenant.default_priority
            return tenant.priority_min
        if not tenant.priority_min <= requested <= tenant.priority_max:
            side = "above" if requested > tenant.priority_max else "below"
            raise PriorityNotAllowed(
                f"priority {requested} is {side} tenant {tenant.name!r}'s allowed range "
                f"{tenant.priority_min}..{tenant.priority_max}"
            )
        return requested

    def resolve_class(self, tenant: TenantConfig, requested: str | None) -> str:
        if requested is None or requested == "":
            return tenant.default_class
        allowed = allowed_classes(tenant)
        if requested not in allowed:
            raise ClassNotAllowed(
                f"class {requested!r} is not allowed for tenant {tenant.name!r}'s key; "
                f"allowed: {', '.join(allowed)}"
            )
        return requested
