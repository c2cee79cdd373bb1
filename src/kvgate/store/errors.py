"""The store's one error type, in a leaf module: the interface (``base``) and the health
tracking (``health``) both raise it, and base refers to health's ``StoreHealth``."""

from __future__ import annotations


class StoreUnavailable(ConnectionError):
    """The backing server cannot be reached; callers fall back (fail-open-local/closed)."""
