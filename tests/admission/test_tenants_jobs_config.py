"""Config validation, tenant directory (401 / priority range), and the async JobStore."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kvgate.admission.config import AdmissionConfig, TenantConfig
from kvgate.admission.tenants import ClassNotAllowed, PriorityNotAllowed, TenantDirectory
from kvgate.clock import ManualClock
from kvgate.gateway.jobs import JobStore

TENANTS = [
    {"name": "acme", "api_keys": ["k1", "k2"], "priority_min": 1, "priority_max": 5},
    {"name": "zeta", "api_keys": ["k3"], "default_priority": 0, "default_class": "batch"},
]


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"no_such": 1}, "no_such"),
        ({"total_quota": 0}, "total_quota"),
        ({"tenants": [{"name": "a", "weight": 0}]}, "tenants.0.weight"),
        ({"tenants": [{"name": "a", "priority_min": 3, "priority_max": 1}]}, "tenants.0"),
        ({"failure_mode": "maybe"}, "failure_mode"),
        (
            {"queue": {"long_request_reserved_fraction": 1.5}},
            "queue.long_request_reserved_fraction",
        ),
        ({"degrade": {"modes": {"batch": "nowhere"}}}, "degrade.modes.batch"),
    ],
)
def test_config_errors_name_the_field(config: dict, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        AdmissionConfig(**config)
    assert field in str(err.value).replace("\n", " ").replace(" ", ".")


def test_config_cross_checks() -> None:
    with pytest.raises(ValidationError, match="guarantees sum"):
        AdmissionConfig(total_quota=100, tenants=[{"name": "a", "guaranteed": 101}])
    with pytest.raises(ValidationError, match="key already used"):
        AdmissionConfig(
            tenants=[{"name": "a", "api_keys": ["x"]}, {"name": "b", "api_keys": ["x"]}]
        )
    with pytest.raises(ValidationError, match="duplicate tenant"):
        AdmissionConfig(tenants=[{"name": "a"}, {"name": "a"}])
    with pytest.raises(ValidationError, match="absolute_hard_cap"):
        AdmissionConfig(total_quota=100, absolute_hard_cap=50)


def test_auth_maps_keys_to_tenants_and_refuses_unknown_keys() -> None:
    directory = TenantDirectory(AdmissionConfig(tenants=TENANTS))
    assert directory.auth_enabled
    acme = directory.authenticate("k2")
    assert acme is not None and acme.name == "acme"
    assert directory.authenticate("k3").name == "zeta"  # type: ignore[union-attr]
    assert directory.authenticate("nope") is None
    assert directory.authenticate(None) is None


def test_without_keys_everyone_is_the_default_tenant() -> None:
    directory = TenantDirectory(AdmissionConfig())
    assert not directory.auth_enabled
    assert directory.authenticate(None).name == "default"  # type: ignore[union-attr]
    assert directory.authenticate("anything").name == "default"  # type: ignore[union-attr]


def test_priority_cannot_be_raised_above_the_tenant_range() -> None:
    directory = TenantDirectory(AdmissionConfig(tenants=TENANTS))
    acme = directory.get("acme")
    assert acme is not None
    assert directory.resolve_priority(acme, None) == 1
    assert directory.resolve_priority(acme, 4) == 4
    with pytest.raises(PriorityNotAllowed, match="below tenant 'acme'"):
        directory.resolve_priority(acme, -3)
    with pytest.raises(PriorityNotAllowed, match="above tenant 'acme'"):
        directory.resolve_priority(acme, 6)
    zeta = directory.get("zeta")
    assert zeta is not None and zeta.default_class == "batch"
    with pytest.raises(PriorityNotAllowed):
        directory.resolve_priority(zeta, 1)


def test_tenant_config_defaults() -> None:
    t = TenantConfig(name="x")
    assert (t.guaranteed, t.weight, t.hard_cap, t.default_class) == (0, 1.0, None, "interactive")


def test_job_store_keeps_results_for_the_ttl_and_only_for_the_tenant() -> None:
    clock = ManualClock()
    jobs = JobStore(clock, ttl_s=60)
    job_id = jobs.create("acme")
    pending = jobs.get(job_id, "acme")
    assert pending is not None and pending.status is None
    assert jobs.get(job_id, "zeta") is None
    clock.advance(500)  # pending jobs do not expire with the result TTL
    jobs.set_result(job_id, 200, {"choices": []})
    done = jobs.get(job_id, "acme")
    assert done is not None and (done.status, done.body) == (200, {"choices": []})
    clock.advance(59.9)
    assert jobs.get(job_id, "acme") is not None
    clock.advance(0.1)
    assert jobs.get(job_id, "acme") is None
    assert len(jobs) == 0
    assert jobs.get("job-unknown", "acme") is None
    jobs.set_result("job-unknown", 200, {})  # a late result for an expired job is ignored


def test_class_comes_from_the_key_and_a_header_picks_within_it() -> None:
    directory = TenantDirectory(
        AdmissionConfig(
            tenants=[
                {"name": "plain", "api_keys": ["p"]},
                {"name": "mixed", "api_keys": ["m"], "classes": ["interactive", "batch"]},
            ]
        )
    )
    plain, mixed = directory.get("plain"), directory.get("mixed")
    assert plain is not None and mixed is not None
    assert directory.resolve_class(plain, None) == "interactive"
    assert directory.resolve_class(plain, "interactive") == "interactive"
    with pytest.raises(ClassNotAllowed, match="'batch' is not allowed for tenant 'plain'"):
        directory.resolve_class(plain, "batch")
    assert directory.resolve_class(mixed, "batch") == "batch"
    with pytest.raises(ClassNotAllowed, match="allowed: interactive, batch"):
        directory.resolve_class(mixed, "premium")
    with pytest.raises(ValueError, match="default_class 'batch' must be one of classes"):
        TenantConfig(name="x", classes=["interactive"], default_class="batch")
