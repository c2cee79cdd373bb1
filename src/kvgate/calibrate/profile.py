"""A capacity profile: what a load test found for one model version + deployment shape.

Profiles live in the store under ``/kvgate/capacity/<model_version>/<deployment>`` (both
parts URL-quoted, as model names contain "/") and in YAML files written by
``kvgate calibrate``. A node references one by ``model_version`` + ``deployment``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import yaml

from kvgate.store.keys import ROOT
from kvgate.yaml_file import read_yaml

CAPACITY_PREFIX = f"{ROOT}/capacity/"
REQUIRED = (
    "model_version",
    "deployment",
    "context",
    "capacity_runtime_tokens",
    "knee_concurrency",
    "ttft_p99_at_knee",
    "measured_at",
)


class ProfileError(ValueError):
    """A profile document is invalid; the message names the field."""


@dataclass(frozen=True, slots=True)
class CapacityProfile:
    model_version: str
    deployment: str
    context: int  # prompt + output tokens per request in the ramp
    capacity_runtime_tokens: int  # engine runtime tokens at the knee
    knee_concurrency: int
    ttft_p99_at_knee: float  # seconds
    measured_at: float  # unix time
    # how it was found (not needed to use it): engine type, rule that fired, sources
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return profile_key(self.model_version, self.deployment)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def from_dict(cls, data: Any, where: str = "profile") -> CapacityProfile:
        if not isinstance(data, dict):
            raise ProfileError(f"{where}: must be a mapping")
        missing = [k for k in REQUIRED if k not in data]
        if missing:
            raise ProfileError(f"{where}.{missing[0]}: field required")
        try:
            profile = cls(
                model_version=str(data["model_version"]),
                deployment=str(data["deployment"]),
                context=int(data["context"]),
                capacity_runtime_tokens=int(data["capacity_runtime_tokens"]),
                knee_concurrency=int(data["knee_concurrency"]),
                ttft_p99_at_knee=float(data["ttft_p99_at_knee"]),
                measured_at=float(data["measured_at"]),
                details=dict(data.get("details") or {}),
            )
        except (TypeError, ValueError) as exc:
            raise ProfileError(f"{where}: {exc}") from None
        for name in ("context", "capacity_runtime_tokens", "knee_concurrency"):
            if getattr(profile, name) < 1:
                raise ProfileError(f"{where}.{name}: must be >= 1")
        if not profile.model_version or not profile.deployment:
            raise ProfileError(f"{where}.model_version/deployment: must not be empty")
        return profile

    @classmethod
    def from_json(cls, text: str) -> CapacityProfile:
        return cls.from_dict(json.loads(text))


def profile_key(model_version: str, deployment: str) -> str:
    return f"{CAPACITY_PREFIX}{quote(model_version, safe='')}/{quote(deployment, safe='')}"


def parse_profile_key(key: str) -> tuple[str, str] | None:
    if not key.startswith(CAPACITY_PREFIX):
        return None
    parts = key[len(CAPACITY_PREFIX) :].split("/")
    if len(parts) != 2:
        return None
    return unquote(parts[0]), unquote(parts[1])


def load_profile_file(path: str | Path) -> CapacityProfile:
    data = read_yaml(path, ProfileError)
    return CapacityProfile.from_dict(data, where=str(path))
