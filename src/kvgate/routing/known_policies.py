"""The routing policy names ``RoutingConfig.policy`` accepts.

The policies (``kvgate.routing.policies``) read the routing configuration, so the
configuration cannot import them to check a name at load. It asks this leaf module
instead: it names the built-in policies, and ``register_policy`` records every policy
registered since (the simulator's ``oracle``, a test's own), so a configuration naming
one validates. ``tests/routing/test_config.py`` checks the built-in names here are the
ones ``kvgate.routing.policies`` registers.
"""

from __future__ import annotations

BUILTIN_POLICIES = (
    "hybrid",
    "cache_aware",
    "consistent_hash",
    "least_load",
    "least_request",
    "round_robin",
    "random",
    "precise",
)

_known: set[str] = set(BUILTIN_POLICIES)


def add_policy_name(name: str) -> None:
    """Accept ``name`` in ``RoutingConfig.policy`` from now on (``register_policy`` calls it)."""
    _known.add(name)


def known_policy_names() -> frozenset[str]:
    return frozenset(_known)
