"""Versioned config with baselines: immutable numbered versions, an active pointer, rollback.

``VersionStore`` reads and writes them in any store; ``ConfigReloader`` makes a running
gateway follow the active version; ``kvgate config`` and ``/admin/config/...`` drive them.
"""

from __future__ import annotations

from kvgate.configver.diff import diff_documents
from kvgate.configver.document import SECTIONS, document_of, merge_document, validate_document
from kvgate.configver.versions import Activation, ConfigVersion, VersionError, VersionStore


async def prepare_apply(
    versions: VersionStore, update: dict[str, object]
) -> tuple[dict[str, object], list[str]]:
    """The document an apply of ``update`` (a config file's sections) would store."""
    active = await versions.active()
    base = active.document if active is not None else {}
    return merge_document(base, update)


__all__ = [
    "SECTIONS",
    "Activation",
    "ConfigVersion",
    "VersionError",
    "VersionStore",
    "diff_documents",
    "document_of",
    "merge_document",
    "prepare_apply",
    "validate_document",
]
