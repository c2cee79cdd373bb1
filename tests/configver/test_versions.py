"""Config versions in a store: immutable numbers, diff, rollback, baselines, validation."""

from __future__ import annotations

import pytest

from kvgate.configver import (
    VersionError,
    VersionStore,
    diff_documents,
    document_of,
    merge_document,
    prepare_apply,
)
from kvgate.gateway.config import ConfigError, parse_config
from kvgate.store import open_store


async def test_apply_rollback_baseline_and_refused_apply() -> None:
    store = open_store("memory://")
    vs = VersionStore(store)
    base = document_of(parse_config({}))
    v1 = await vs.apply(base, author="alice", message="first")
    assert (v1.version, v1.parent, v1.author) == (1, None, "alice")
    doc, ignored = await prepare_apply(vs, {"routing": {"policy": "round_robin"}, "store": "x"})
    assert ignored == ["store"]
    v2 = await vs.apply(doc, author="bob")
    assert (v2.version, v2.parent) == (2, 1)
    assert '~ routing.policy: "hybrid" -> "round_robin"' in v2.diff
    assert (await vs.activation()).version == 2  # type: ignore[union-attr]

    await vs.mark_baseline("good", by="alice", version=1)
    act = await vs.rollback(by="carol")
    assert (act.version, act.previous, act.action) == (1, 2, "rollback")
    with pytest.raises(VersionError, match="no earlier version"):
        await vs.rollback(by="carol")
    await vs.rollback(by="carol", to=2)
    act = await vs.rollback(by="carol", baseline="good")
    assert (act.version, act.action) == (1, "baseline_rollback")
    with pytest.raises(VersionError, match="no baseline 'nope'"):
        await vs.rollback(by="carol", baseline="nope")

    # invalid: the error names the field and nothing is written
    before = await store.get_prefix("/kvgate/config/")
    bad, _ = await prepare_apply(vs, {"admission": {"tenants": [{"name": "t", "weight": -1}]}})
    with pytest.raises(ConfigError, match=r"admission\.tenants\[0\]\.weight"):
        await vs.apply(bad, author="mallory")
    with pytest.raises(ConfigError, match="unknown section"):
        merge_document(base, {"routng": {}})
    assert await store.get_prefix("/kvgate/config/") == before
    # versions are never rewritten
    assert (await vs.get(2)).document["routing"]["policy"] == "round_robin"


def test_diff_names_list_items_by_name() -> None:
    old = {"admission": {"tenants": [{"name": "a", "hard_cap": 10}]}, "flags": {"x": True}}
    new = {"admission": {"tenants": [{"name": "a", "hard_cap": 20}]}, "flags": {}}
    assert diff_documents(old, new) == [
        "~ admission.tenants[name=a].hard_cap: 10 -> 20",
        "+ flags: {}",
        "- flags.x: true",
    ]


async def test_resolve_and_changes_default_to_the_active_version() -> None:
    vs = VersionStore(open_store("memory://"))
    with pytest.raises(VersionError, match="no active config version"):
        await vs.resolve(None)
    with pytest.raises(VersionError, match="no config versions yet"):
        await vs.changes(None, None)
    base = document_of(parse_config({}))
    await vs.apply(base, author="alice")
    doc, _ = await prepare_apply(vs, {"routing": {"policy": "round_robin"}})
    await vs.apply(doc, author="bob")
    assert (await vs.resolve(None)).version == 2
    assert (await vs.resolve(1)).detail()["document"] == base
    changes = await vs.changes(None, None)  # the active version against its parent
    assert (changes["from"], changes["to"]) == (1, 2)
    assert changes["diff"] == (await vs.get(2)).diff
    assert '~ routing.policy: "hybrid" -> "round_robin"' in changes["diff"]
    assert await vs.changes(2, 1) == {"from": 2, "to": 1, "diff": diff_documents(doc, base)}
