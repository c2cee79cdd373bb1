"""Two real llama.cpp servers behind ``kvgate serve``: hybrid vs round robin, same requests.

Each policy gets fresh servers (empty caches) and the identical request list: two
~1,000-token prefixes, three questions each. Hybrid must send each repeat to the node
that holds its prefix — the engine itself reports the reused tokens — and so get a lower
mean time to first token than round robin, which splits repeats across nodes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from kvgate.loadgen.probe import Result, build_workload, run_workload, summarize
from kvgate.procs import GatewayProcess, wait_until_routable
from kvgate.procs.llama import LlamaServer

pytestmark = pytest.mark.real_engine


def run_policy(
    policy: str,
    llama_servers: Callable[..., list[LlamaServer]],
    gateway_factory: Callable[..., GatewayProcess],
) -> list[Result]:
    servers = llama_servers(2)
    gw = gateway_factory(
        backends=[s.url for s in servers],
        extra_args=["--engine-type", "llamacpp", "--policy", policy, "--scrape-interval", "1"],
    )
    try:
        wait_until_routable(gw)
        time.sleep(1.5)  # one scrape round so the gateway has fresh reports of both nodes
        return asyncio.run(run_workload(gw.url, build_workload(prefixes=2, per_prefix=3)))
    finally:
        gw.stop()
        for s in servers:
            s.stop()  # free the CPU for the next policy


def test_hybrid_reuses_engine_cache_and_cuts_ttft_vs_round_robin(
    llama_servers: Callable[..., list[LlamaServer]],
    gateway_factory: Callable[..., GatewayProcess],
) -> None:
    rr_results = run_policy("round_robin", llama_servers, gateway_factory)
    hy_results = run_policy("hybrid", llama_servers, gateway_factory)
    rr, hy = summarize(rr_results), summarize(hy_results)
    report = f"round_robin={rr}\nhybrid={hy}\nrr={rr_results}\nhybrid={hy_results}"

    # Hybrid: every repeated prefix was already cached where it was sent (engine-reported).
    repeats = [r for r in hy_results if r.repeat]
    assert repeats and all(r.cached_tokens >= 900 for r in repeats), report
    first_node = {}
    for r in hy_results:
        first_node.setdefault(r.prefix_id, r.node)
        assert r.node == first_node[r.prefix_id], report
    # Round robin split the repeats: fewer cached tokens on the same requests…
    assert hy.cached_tokens > rr.cached_tokens, report
    assert hy.warm_requests > rr.warm_requests, report
    # …and so a lower mean TTFT for hybrid (cold prefill here is ~4-5 s, warm ~0.3 s).
    assert hy.mean_ttft_s < rr.mean_ttft_s, report
