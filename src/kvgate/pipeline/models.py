"""Which served model a request's ``model`` field means."""

from __future__ import annotations

from collections.abc import Collection

DEFAULT_MODEL = "default"


class UnknownModel(LookupError):
    """The requested model is not served, or ``default`` is ambiguous."""

    def __init__(self, requested: str | None, served: Collection[str]) -> None:
        self.requested = requested
        self.served = sorted(served)
        listed = ", ".join(self.served) or "none"
        if requested in (None, DEFAULT_MODEL) and self.served:
            text = f"'model' must name one of the served models: {listed}"
        else:
            text = f"the model {requested!r} is not served here; served models: {listed}"
        super().__init__(text)


def resolve_model(requested: str | None, served: Collection[str]) -> str:
    """The served model a request means: itself, or for none / "default" the only one."""
    if requested is not None and requested in served:
        return requested
    if requested in (None, DEFAULT_MODEL) and len(served) == 1:
        return next(iter(served))
    if requested is not None and DEFAULT_MODEL in served:
        return requested  # a node whose model is unknown ("default") may serve it
    raise UnknownModel(requested, served)
