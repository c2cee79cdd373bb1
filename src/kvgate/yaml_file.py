"""Reading a YAML file given on the command line, with errors that name the file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml


def read_yaml(path: str | Path, error: Callable[[str], Exception], what: str = "") -> Any:
    """The document in ``path``; an unreadable file or invalid YAML raises
    ``error(message)`` (``what`` names the kind of file in the "cannot read" message)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise error(f"cannot read {what}{path}: {exc.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise error(f"{path}: invalid YAML: {exc}") from None
