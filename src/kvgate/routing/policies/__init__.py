"""Routing policies behind one interface; see ``base`` for how to add one."""

from kvgate.routing.policies.base import (
    Policy,
    PolicyFactory,
    RoutingContext,
    create_policy,
    expected_tokens,
    policy_names,
    register_policy,
)
from kvgate.routing.policies.hybrid import CacheAwarePolicy, HybridPolicy
from kvgate.routing.policies.precise import PrecisePolicy
from kvgate.routing.policies.simple import (
    ConsistentHashPolicy,
    LeastLoadPolicy,
    LeastRequestPolicy,
    RandomPolicy,
    RoundRobinPolicy,
)

for _factory in (
    HybridPolicy,
    CacheAwarePolicy,
    ConsistentHashPolicy,
    LeastLoadPolicy,
    LeastRequestPolicy,
    RoundRobinPolicy,
    RandomPolicy,
):
    register_policy(_factory.name, _factory)
# precise: hybrid's placement on the engines' KV-event cache signal
register_policy(PrecisePolicy.name, lambda: PrecisePolicy(HybridPolicy()))

__all__ = [
    "CacheAwarePolicy",
    "ConsistentHashPolicy",
    "HybridPolicy",
    "LeastLoadPolicy",
    "LeastRequestPolicy",
    "Policy",
    "PolicyFactory",
    "PrecisePolicy",
    "RandomPolicy",
    "RoundRobinPolicy",
    "RoutingContext",
    "create_policy",
    "expected_tokens",
    "policy_names",
    "register_policy",
]
