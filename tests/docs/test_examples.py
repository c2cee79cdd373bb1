"""Every example config loads through the real gateway config loader."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgate.gateway.config import ConfigError, load_config, parse_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE_CONFIGS = sorted(EXAMPLES.glob("*.yaml"))


def test_the_three_deployments_have_examples() -> None:
    names = {p.name for p in EXAMPLE_CONFIGS}
    assert {"single-gateway.yaml", "multi-gateway-redis-etcd.yaml", "sidecar.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLE_CONFIGS, ids=lambda p: p.name)
def test_example_config_loads(path: Path) -> None:
    config = parse_config(load_config(path))
    assert config.routing.policy == "hybrid"
    if config.server.host not in ("127.0.0.1", "localhost"):
        # an example bound to the network must not leave the admin API open
        assert config.auth.admin_token


def test_multi_gateway_example_shares_redis_and_etcd() -> None:
    config = parse_config(load_config(EXAMPLES / "multi-gateway-redis-etcd.yaml"))
    schemes = {part.split("://")[0] for part in config.store.split(",")}
    assert schemes == {"redis", "etcd"}


def test_sidecar_example_reads_the_registry() -> None:
    config = parse_config(load_config(EXAMPLES / "sidecar.yaml"))
    assert config.scrape.mode == "registry"
    assert config.nodes == []


def test_loader_names_the_field_of_a_broken_example(tmp_path: Path) -> None:
    text = (EXAMPLES / "single-gateway.yaml").read_text()
    broken = tmp_path / "broken.yaml"
    broken.write_text(text.replace("total_quota: 40000", "total_quota: -5"))
    with pytest.raises(ConfigError, match=r"admission\.total_quota"):
        parse_config(load_config(broken))
