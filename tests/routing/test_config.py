from __future__ import annotations

import pytest
from pydantic import ValidationError

from kvgate.routing import RoutingConfig, register_policy
from kvgate.routing.config import FILTER_NAMES
from kvgate.routing.filters import FILTERS
from kvgate.routing.known_policies import BUILTIN_POLICIES, known_policy_names
from kvgate.routing.policies import HybridPolicy, create_policy, policy_names


def test_defaults() -> None:
    cfg = RoutingConfig()
    assert cfg.policy == "hybrid"
    assert (cfg.index_ttl_s, cfg.freshness_s, cfg.scrape_interval_s, cfg.warmup_s) == (
        120.0,
        15.0,
        3.0,
        1800.0,
    )
    assert cfg.max_retries == 2
    assert cfg.route_key.kb_version_header == "X-KB-Version"


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"policy": "fastest"}, "policy"),
        ({"scrape_interval_s": 9}, "scrape_interval_s"),
        ({"index_ttl_s": 0}, "index_ttl_s"),
        ({"bounded_load_factor": 1.0}, "bounded_load_factor"),
        ({"route_key": {"kb_version_header": "bad header"}}, "kb_version_header"),
        ({"route_key": {"user": True}}, "user"),
        ({"unknown_option": 1}, "unknown_option"),
        ({"freshness_s": 1, "scrape_interval_s": 3}, "freshness_s"),
    ],
)
def test_invalid_values_name_the_field(data: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        RoutingConfig(**data)  # type: ignore[arg-type]


def test_the_config_knows_the_filters_and_policies_the_routing_layer_defines() -> None:
    # the configuration names them without importing filters or policies (no import cycle)
    assert tuple(FILTERS) == FILTER_NAMES
    assert set(BUILTIN_POLICIES) <= policy_names() <= known_policy_names()
    for name in BUILTIN_POLICIES:
        assert create_policy(name).name == name
        assert RoutingConfig(policy=name).policy == name


def test_a_registered_policy_validates_in_the_config() -> None:
    with pytest.raises(ValidationError, match="policy"):
        RoutingConfig(policy="test_registered_later")
    register_policy("test_registered_later", HybridPolicy)
    assert RoutingConfig(policy="test_registered_later").policy == "test_registered_later"
