"""Node event endpoints and hashing settings are validated at load, naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgate.gateway.config import ConfigError, parse_config


def _node(**extra: object) -> dict[str, object]:
    return {"id": "a", "url": "http://127.0.0.1:8001", **extra}


def test_event_endpoint_per_node() -> None:
    cfg = parse_config(
        {"nodes": [_node(kv_events={"endpoint": "tcp://10.0.0.5:5557",
                                    "replay_endpoint": "tcp://10.0.0.5:5558", "topic": "kv"})]}
    )  # fmt: skip
    ev = cfg.nodes[0].kv_events
    assert ev is not None and ev.replay_endpoint == "tcp://10.0.0.5:5558" and ev.topic == "kv"
    assert parse_config({"nodes": [_node()]}).nodes[0].kv_events is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"nodes": [_node(kv_events={"endpoint": "http://x:1"})]}, "nodes[0].kv_events.endpoint"),
        (
            {"nodes": [_node(engine_type="tgi", kv_events={"endpoint": "tcp://x:1"})]},
            "publishes no KV events",
        ),
        ({"kv_events": {"hash_algo": "builtin"}}, "kv_events.hash_algo"),
        ({"kv_events": {"block_size": 0}}, "kv_events.block_size"),
    ],
)
def test_bad_event_config_names_the_field(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_config(data)


def test_a_missing_or_broken_tokenizer_names_the_model(tmp_path: Path) -> None:
    from kvgate.gateway.app import Gateway

    with pytest.raises(ConfigError, match=r"kv_events\.tokenizers: m1: tokenizer file"):
        parse_config({"kv_events": {"tokenizers": {"m1": "/nonexistent/tokenizer.json"}}})
    broken = tmp_path / "tokenizer.json"
    broken.write_text("{}")
    cfg = parse_config({"kv_events": {"tokenizers": {"m1": str(broken)}}})
    with pytest.raises(ValueError, match=r"kv_events\.tokenizers\.m1: cannot load tokenizer"):
        Gateway(cfg)
