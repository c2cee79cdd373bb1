"""Config is validated at load; every error names the field."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from kvgate.gateway import cli
from kvgate.gateway.config import ConfigError, load_config, parse_config


def test_defaults_are_valid() -> None:
    config = parse_config({})
    assert config.store == "memory://"
    assert config.nodes == []
    assert config.server.host == "127.0.0.1"


def test_bad_node_url_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"nodes\[1\]\.url: .*http://"):
        parse_config({"nodes": [{"id": "a", "url": "http://x:1"}, {"id": "b", "url": "x:2"}]})


def test_unknown_key_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"server\.prot"):
        parse_config({"server": {"prot": 1}})


def test_unknown_flag_and_engine_type() -> None:
    with pytest.raises(ConfigError, match=r"flags: .*unknown flag"):
        parse_config({"flags": {"warp_drive": True}})
    with pytest.raises(ConfigError, match=r"nodes\[0\]\.engine_type"):
        parse_config({"nodes": [{"id": "a", "url": "http://x:1", "engine_type": "tpu"}]})


def test_duplicate_node_ids() -> None:
    with pytest.raises(ConfigError, match="duplicate node id 'a'"):
        parse_config(
            {"nodes": [{"id": "a", "url": "http://x:1"}, {"id": "a", "url": "http://y:1"}]}
        )


def test_node_url_is_normalised() -> None:
    config = parse_config({"nodes": [{"id": "a", "url": "http://x:1/v1/"}]})
    assert config.nodes[0].url == "http://x:1"


def test_nested_routing_and_admission_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"routing\.no_such_option"):
        parse_config({"routing": {"no_such_option": 1}})
    with pytest.raises(ConfigError, match=r"admission\.no_such_option"):
        parse_config({"admission": {"no_such_option": 1}})


def test_yaml_file_and_cli_overrides(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(
        "server: {port: 9000}\nnodes: [{id: a, url: 'http://h:1'}]\nflags: {retries: false}\n"
    )
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(
        [
            "--config",
            str(path),
            "--port",
            "9100",
            "--backend",
            "http://e:1",
            "--backend",
            "http://e:2",
            "--flag",
            "cold_boost=off",
            "--admin-token",
            "t0ken",
        ]
    )
    config = parse_config(cli.config_from_args(args))
    assert config.server.port == 9100
    assert [n.id for n in config.nodes] == ["node-0", "node-1"]
    assert config.flags == {"retries": False, "cold_boost": False}
    assert config.auth.admin_token == "t0ken"


def test_bad_yaml_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text("server: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")


def test_bad_flag_argument() -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    with pytest.raises(ConfigError, match="--flag"):
        cli.config_from_args(parser.parse_args(["--flag", "retries=maybe"]))
