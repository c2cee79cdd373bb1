from __future__ import annotations

import pytest
from pydantic import ValidationError

from kvgate.routing import RoutingConfig


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
