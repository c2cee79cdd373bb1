"""Immutable numbered config versions in the store, an active pointer and named baselines.

Keys (DESIGN key layout, under ``/kvgate/config/``):

* ``/kvgate/config/<n>`` — version *n* (1, 2, …): the document, author, time, message,
  the version it was made from (``parent``) and the diff against it. Never rewritten.
* ``/kvgate/config/active`` — which version every replica must run, who switched to it,
  when and how (apply | rollback | baseline_rollback | bootstrap).
* ``/kvgate/config/baselines/<name>`` — a known-good version.

The store interface has no compare-and-set, so a new number is claimed by writing it
with a nonce and reading it back; a writer that lost the race takes the next number.
Validation happens before anything is written: an invalid apply changes nothing.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from kvgate.configver.diff import diff_documents
from kvgate.configver.document import validate_document
from kvgate.gateway.config import GatewayConfig
from kvgate.store.base import KVStore
from kvgate.store.keys import CONFIG_PREFIX, config_key

ACTIVE_KEY = config_key("active")
BASELINES_PREFIX = f"{CONFIG_PREFIX}baselines/"


class VersionError(ValueError):
    """A version, baseline or rollback target does not exist (or cannot be used)."""


@dataclass(frozen=True, slots=True)
class ConfigVersion:
    version: int
    document: dict[str, Any]
    author: str
    created_at: float
    message: str = ""
    parent: int | None = None
    diff: list[str] = field(default_factory=list)
    nonce: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> ConfigVersion:
        d = json.loads(text)
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})

    def header(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "author": self.author,
            "created_at": self.created_at,
            "message": self.message,
            "parent": self.parent,
            "changes": len(self.diff),
        }

    def detail(self) -> dict[str, Any]:
        """The header with the whole document and the diff against the parent."""
        return {**self.header(), "document": self.document, "diff": self.diff}


@dataclass(frozen=True, slots=True)
class Activation:
    version: int
    by: str
    at: float
    action: str  # bootstrap | apply | rollback | baseline_rollback
    previous: int | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Activation:
        d = json.loads(text)
        return cls(
            version=int(d["version"]),
            by=str(d.get("by", "")),
            at=float(d.get("at", 0.0)),
            action=str(d.get("action", "")),
            previous=None if d.get("previous") is None else int(d["previous"]),
        )


def version_key(n: int) -> str:
    return config_key(str(n))


class VersionStore:
    def __init__(self, store: KVStore, *, process: GatewayConfig | None = None) -> None:
        self.store = store
        self.process = process  # validates documents against this process's own sections

    # -- reading -----------------------------------------------------------------------
    async def numbers(self) -> list[int]:
        keys = await self.store.get_prefix(CONFIG_PREFIX)
        out = []
        for key in keys:
            tail = key[len(CONFIG_PREFIX) :]
            if tail.isdigit():
                out.append(int(tail))
        return sorted(out)

    async def get(self, n: int) -> ConfigVersion:
        text = await self.store.get(version_key(n))
        if text is None:
            raise VersionError(f"no config version {n}")
        return ConfigVersion.from_json(text)

    async def history(self) -> list[ConfigVersion]:
        raw = await self.store.get_prefix(CONFIG_PREFIX)
        out = []
        for key, text in raw.items():
            if key[len(CONFIG_PREFIX) :].isdigit():
                out.append(ConfigVersion.from_json(text))
        return sorted(out, key=lambda v: v.version)

    async def activation(self) -> Activation | None:
        text = await self.store.get(ACTIVE_KEY)
        return Activation.from_json(text) if text else None

    async def resolve(
        self, n: int | None, *, no_active: str = "no active config version"
    ) -> ConfigVersion:
        """Version ``n``, or (``None``) the active one; ``no_active`` is the error when
        there is none."""
        if n is None:
            act = await self.activation()
            if act is None:
                raise VersionError(no_active)
            n = act.version
        return await self.get(n)

    async def changes(self, frm: int | None, to: int | None) -> dict[str, Any]:
        """The diff from ``frm`` (default: the target's parent) to ``to`` (default: the
        active version)."""
        target = await self.resolve(to, no_active="no config versions yet")
        if frm is None:
            frm = target.parent
        base = await self.get(frm) if frm is not None else None
        lines = diff_documents(base.document if base else None, target.document)
        return {"from": frm, "to": target.version, "diff": lines}

    async def active(self) -> ConfigVersion | None:
        act = await self.activation()
        return await self.get(act.version) if act else None

    async def baselines(self) -> dict[str, int]:
        raw = await self.store.get_prefix(BASELINES_PREFIX)
        return {k[len(BASELINES_PREFIX) :]: int(json.loads(v)["version"]) for k, v in raw.items()}

    # -- writing -----------------------------------------------------------------------
    async def create(
        self, document: dict[str, Any], *, author: str, message: str = "", parent: int | None = None
    ) -> ConfigVersion:
        """Validate, then store a new immutable version (not yet active)."""
        validate_document(document, self.process)  # raises ConfigError: nothing written
        base = await self.get(parent) if parent is not None else None
        diff = diff_documents(base.document if base else None, document)
        nonce = uuid.uuid4().hex
        numbers = await self.numbers()
        n = (numbers[-1] if numbers else 0) + 1
        for _ in range(16):
            if await self.store.get(version_key(n)) is None:
                record = ConfigVersion(
                    n, document, author, time.time(), message, parent, diff, nonce
                )
                await self.store.put(version_key(n), record.to_json())
                stored = await self.get(n)
                if stored.nonce == nonce:
                    return stored
            n += 1
        raise VersionError("could not claim a version number (too many concurrent writers)")

    async def activate(self, n: int, *, by: str, action: str) -> Activation:
        await self.get(n)  # must exist
        current = await self.activation()
        act = Activation(n, by, time.time(), action, current.version if current else None)
        await self.store.put(ACTIVE_KEY, act.to_json())
        return act

    async def apply(
        self, document: dict[str, Any], *, author: str, message: str = ""
    ) -> ConfigVersion:
        current = await self.activation()
        version = await self.create(
            document, author=author, message=message, parent=current.version if current else None
        )
        await self.activate(version.version, by=author, action="apply")
        return version

    async def rollback(
        self, *, by: str, to: int | None = None, baseline: str | None = None
    ) -> Activation:
        """To version ``to``, to a named baseline, or (neither) to the active one's parent."""
        if baseline is not None:
            marks = await self.baselines()
            if baseline not in marks:
                known = ", ".join(sorted(marks)) or "none"
                raise VersionError(f"no baseline {baseline!r} (known: {known})")
            return await self.activate(marks[baseline], by=by, action="baseline_rollback")
        if to is None:
            active = await self.active()
            if active is None:
                raise VersionError("no active config version to roll back from")
            if active.parent is None:
                raise VersionError(f"version {active.version} has no earlier version")
            to = active.parent
        target = await self.get(to)
        validate_document(target.document, self.process)
        return await self.activate(to, by=by, action="rollback")

    async def mark_baseline(self, name: str, *, by: str, version: int | None = None) -> int:
        if not name or "/" in name:
            raise VersionError("baseline name must be non-empty and contain no '/'")
        version = (
            await self.resolve(version, no_active="no active config version to mark")
        ).version
        value = json.dumps({"version": version, "by": by, "at": time.time()})
        await self.store.put(f"{BASELINES_PREFIX}{name}", value)
        return version
