"""The routing layer: pure, clock-injected objects shared by the gateway and the simulator."""

from kvgate.routing.config import RouteKeyConfig, RoutingConfig
from kvgate.routing.consistent_hash import HashRing
from kvgate.routing.feedback import HitFeedback
from kvgate.routing.node_view import NodeEntry, NodeView, UnknownNode
from kvgate.routing.policies import Policy, RoutingContext, policy_names, register_policy
from kvgate.routing.prefix_index import PrefixIndex
from kvgate.routing.request import build_route_request, route_request_from_tokens
from kvgate.routing.router import Router

__all__ = [
    "HashRing",
    "HitFeedback",
    "NodeEntry",
    "NodeView",
    "Policy",
    "PrefixIndex",
    "RouteKeyConfig",
    "Router",
    "RoutingConfig",
    "RoutingContext",
    "UnknownNode",
    "build_route_request",
    "policy_names",
    "register_policy",
    "route_request_from_tokens",
]
