"""Shared fixtures: real engines, real Redis/etcd servers, real gateways on free ports."""

pytest_plugins = [
    "tests.fixtures.engines",
    "tests.fixtures.servers",
    "tests.fixtures.gateway",
]
