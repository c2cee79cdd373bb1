"""API key → tenant, and the priority range a tenant may ask for."""

from __future__ import annotations

from kvgate.admission.config import AdmissionConfig, TenantConfig


class PriorityNotAllowed(ValueError):
    """A client asked for a priority outside its tenant's allowed range."""


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
        if requested > tenant.priority_max:
            raise PriorityNotAllowed(
                f"priority {requested} is above tenant {tenant.name!r}'s allowed maximum "
                f"{tenant.priority_max}"
            )
        if requested < tenant.priority_min:
            return tenant.priority_min
        return requested
