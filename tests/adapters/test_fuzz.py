"""Malformed scrapes (truncated, corrupted, random) never raise: they make stale reports.

Seeded ``random`` so every run checks the same inputs (hypothesis is not installed).
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from kvgate.adapters import get_adapter
from kvgate.adapters.llamacpp import LlamaCppAdapter
from kvgate.types import NodeReport

SAMPLES = Path(__file__).parent / "samples"
CASES = [
    ("vllm", "vllm.txt"),
    ("sim", "vllm.txt"),
    ("sglang", "sglang.txt"),
    ("tgi", "tgi.txt"),
    ("llamacpp", "llamacpp.txt"),
]


def well_formed(r: NodeReport, node_id: str) -> None:
    assert r.node_id == node_id
    for value in (r.running, r.waiting, r.kv_usage, r.prompt_tokens_rate):
        assert math.isfinite(value) and value >= 0
    assert 0.0 <= r.kv_usage <= 1.0
    assert r.prefix_hit_rate is None or 0.0 <= r.prefix_hit_rate <= 1.0
    NodeReport.from_json(r.to_json())  # always publishable


@pytest.mark.parametrize(("engine", "file"), CASES)
def test_truncated_mid_line_is_stale(engine: str, file: str) -> None:
    adapter = get_adapter(engine)
    text = (SAMPLES / file).read_text()
    previous = adapter.parse(text, node_id="n", now=0.0)
    assert not previous.stale
    rng = random.Random(f"truncate-{engine}")
    cuts = [i for i in range(1, len(text)) if text[i - 1] != "\n"]
    for cut in rng.sample(cuts, 200):
        r = adapter.parse(text[:cut], node_id="n", now=3.0, previous=previous)
        assert r.stale, f"cut at {cut}: {text[max(0, cut - 40) : cut]!r}"
        well_formed(r, "n")
        # the counters survive for the next good scrape
        assert r.extra.get("prompt_tokens_total") == previous.extra.get("prompt_tokens_total")


@pytest.mark.parametrize(("engine", "file"), CASES)
def test_corrupted_bytes_never_raise(engine: str, file: str) -> None:
    adapter = get_adapter(engine)
    data = (SAMPLES / file).read_bytes()
    rng = random.Random(f"corrupt-{engine}")
    stale = 0
    for _ in range(300):
        buf = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        text = bytes(buf).decode("utf-8", errors="replace")
        r = adapter.parse(text, node_id="n", now=1.0)
        well_formed(r, "n")
        stale += r.stale
    # Most corruptions land in a name, label or value and must be refused; some only
    # touch a comment or a digit and legitimately still parse.
    assert stale > 100


@pytest.mark.parametrize(("engine", "file"), CASES)
def test_line_shuffles_and_drops_never_raise(engine: str, file: str) -> None:
    adapter = get_adapter(engine)
    lines = (SAMPLES / file).read_text().splitlines(keepends=True)
    rng = random.Random(f"lines-{engine}")
    for _ in range(100):
        picked = [ln for ln in lines if rng.random() > 0.3]
        rng.shuffle(picked)
        well_formed(adapter.parse("".join(picked), node_id="n", now=1.0), "n")


def test_random_garbage_is_stale() -> None:
    rng = random.Random("garbage")
    alphabet = 'abc_:{}="\\ \n#0123456789.+-eInfNa\t,'
    for engine in ("vllm", "sglang", "tgi", "llamacpp", "sim"):
        adapter = get_adapter(engine)
        for _ in range(200):
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 300)))
            r = adapter.parse(text, node_id="g", now=0.0)
            well_formed(r, "g")
            assert r.stale  # never contains the required gauges by chance


def test_llamacpp_bad_slots_never_raise() -> None:
    adapter = LlamaCppAdapter()
    metrics = (SAMPLES / "llamacpp.txt").read_text()
    slots = (SAMPLES / "llamacpp_slots.json").read_text()
    rng = random.Random("slots")
    variants = [
        "",
        "null",
        "{}",
        "[1, 2]",
        '[{"n_ctx": "big", "is_processing": true, "n_past": -5}]',
        '[{"n_ctx": 0}]',
    ]
    variants += [slots[: rng.randrange(len(slots))] for _ in range(50)]
    for text in variants:
        r = adapter.parse(metrics, node_id="l", now=0.0, slots_text=text)
        assert not r.stale  # /metrics was fine
        well_formed(r, "l")
