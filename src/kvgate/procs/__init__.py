"""Child processes that tests, benchmarks and the demo start: kvgate engine-sims and
gateways, real llama.cpp servers. Each is started on a free loopback port, waited for
until ``/health`` answers, and stopped by PID."""

from kvgate.procs.handle import ChildFailed, ProcessHandle, healthy, wait_for_ports
from kvgate.procs.servers import (
    EngineProcess,
    GatewayProcess,
    start_engine_process,
    start_gateway_process,
    wait_until_routable,
)

__all__ = [
    "ChildFailed",
    "EngineProcess",
    "GatewayProcess",
    "ProcessHandle",
    "healthy",
    "start_engine_process",
    "start_gateway_process",
    "wait_for_ports",
    "wait_until_routable",
]
