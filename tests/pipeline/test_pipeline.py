"""The pipeline's own rules: retry budget, outlier ejection and probes, degrade, retries;
and that the simulator runs them (the same object the gateway drives)."""

from __future__ import annotations

import random

import pytest

from kvgate.clock import ManualClock, run_now
from kvgate.flags import Flags
from kvgate.pipeline import Failure, GiveUp, PipelineConfig, RequestPipeline
from kvgate.pipeline.retry_budget import RetryBudget
from kvgate.routing import NodeView, Router, RoutingConfig, route_request_from_tokens
from kvgate.routing.outlier import OutlierConfig, OutlierDetector
from kvgate.sim.cluster import ClusterSim, SimConfig
from kvgate.sim.events import ClusterEvent
from kvgate.types import AdmissionKind, AdmissionResult, NodeSpec, RouteRequest
from kvgate.workloads import generate_workload


def test_retry_budget_is_a_fraction_of_requests_over_the_window() -> None:
    budget = RetryBudget(ratio=0.2, window_s=10.0, min_retries=1)
    assert budget.try_spend(0.0)  # the floor: a quiet gateway may still retry once
    assert not budget.try_spend(0.0)
    for _ in range(20):
        budget.record_request(1.0)
    assert budget.allowed(1.0) == 4
    assert [budget.try_spend(1.0) for _ in range(4)] == [True, True, True, False]
    assert budget.spent(1.0) == 4
    assert budget.allowed(12.0) == 1 and budget.spent(12.0) == 0  # the window moved on


def test_outlier_ejects_at_once_and_probes_back_with_backoff() -> None:
    detector = OutlierDetector(OutlierConfig(base_ejection_s=1.0, max_ejection_s=3.0))
    assert detector.record_failure("a", "connect", 10.0)  # one connect failure ejects
    assert detector.ejected() == {"a"}
    assert detector.due_probes(10.5) == []
    assert detector.next_probe_at() == 11.0
    assert detector.due_probes(11.0) == ["a"] and detector.due_probes(11.0) == []  # one probe
    detector.probe_result("a", False, 11.2)  # still down: ejected twice as long
    assert detector.next_probe_at() == pytest.approx(13.2)
    assert detector.due_probes(13.2) == ["a"]
    detector.probe_result("a", False, 13.3)
    assert detector.next_probe_at() == pytest.approx(16.3)  # capped at max_ejection_s
    assert detector.due_probes(16.3) == ["a"]
    detector.probe_result("a", True, 16.4)
    assert detector.ejected() == frozenset() and detector.next_probe_at() is None
    # 5xx answers eject only after consecutive_5xx in a row; a success resets the count
    assert not detector.record_failure("b", "http_5xx", 20.0)
    assert not detector.record_failure("b", "http_5xx", 20.0)
    detector.record_success("b")
    assert not detector.record_failure("b", "http_5xx", 20.0)
    assert not detector.record_failure("b", "http_5xx", 20.0)
    assert detector.record_failure("b", "http_5xx", 20.0)


def test_outlier_detection_flag_off_never_ejects() -> None:
    detector = OutlierDetector(enabled=lambda: False)
    assert not detector.record_failure("a", "connect", 0.0)
    assert detector.ejected() == frozenset()


def _pipeline(pools: tuple[str, ...] = ("default",) * 3, **flags: bool) -> RequestPipeline:
    clock = ManualClock(100.0)
    config = RoutingConfig(policy="least_load")
    nodes = NodeView(clock, config)
    for i, pool in enumerate(pools):
        nodes.add_node(NodeSpec(f"n{i}", f"http://127.0.0.1:{9000 + i}", pool=pool))
    router = Router(config, nodes, flags=Flags(flags), clock=clock, rng=random.Random(1))
    return RequestPipeline(
        router=router,
        admission=None,
        flags=router.flags,
        clock=clock,
        max_retries=2,
        config=PipelineConfig.model_validate({"retry_budget": {"min_retries": 100}}),
    )


def _route(i: int = 0) -> RouteRequest:
    return route_request_from_tokens(
        request_id=f"r{i}", model="m", prompt_tokens=40, block_hashes=[1, 2], route_key="m:k"
    )


def test_retries_skip_tried_and_ejected_nodes_and_stop_at_max_retries() -> None:
    pipeline = _pipeline()
    flow = pipeline.start(_route())
    pipeline.accept(flow, None)
    tried = []
    with pytest.raises(GiveUp) as stop:
        while True:
            decision = pipeline.next_attempt(flow)
            tried.append(decision.node_id)
            pipeline.attempt_failed(flow, decision, Failure("connect", "refused"))
    assert sorted(tried) == ["n0", "n1", "n2"]  # 1 + max_retries attempts, each elsewhere
    assert stop.value.status == 502 and stop.value.code == "upstream_connect"
    assert pipeline.outlier.ejected() == {"n0", "n1", "n2"}
    # every node ejected: a new request still gets a first try (panic), but no retry
    flow = pipeline.start(_route(1))
    decision = pipeline.next_attempt(flow)
    pipeline.attempt_failed(flow, decision, Failure("connect", "refused"))
    with pytest.raises(GiveUp):
        pipeline.next_attempt(flow)


def test_a_non_retryable_failure_and_the_retries_flag_end_the_request() -> None:
    pipeline = _pipeline()
    flow = pipeline.start(_route())
    decision = pipeline.next_attempt(flow)
    pipeline.attempt_failed(flow, decision, Failure("x", "no", retryable=False))
    with pytest.raises(GiveUp):
        pipeline.next_attempt(flow)
    pipeline = _pipeline(retries=False)
    flow = pipeline.start(_route())
    decision = pipeline.next_attempt(flow)
    pipeline.attempt_failed(flow, decision, Failure("connect", "refused"))
    with pytest.raises(GiveUp, match="after 1 attempt"):
        pipeline.next_attempt(flow)


def test_degrade_is_applied_to_the_route() -> None:
    pipeline = _pipeline(("default", "default", "economy"))
    flow = pipeline.start(_route())
    pipeline.accept(flow, AdmissionResult(AdmissionKind.ADMIT, "elastic"))
    assert flow.route.pool == "default"  # economy nodes take degraded work only
    assert pipeline.next_attempt(flow).node_id in ("n0", "n1")
    flow = pipeline.start(_route(1))
    pipeline.accept(
        flow, AdmissionResult(AdmissionKind.DEGRADE, "total", degrade_to="economy_pool")
    )
    assert flow.route.pool == "economy" and pipeline.next_attempt(flow).node_id == "n2"
    flow = pipeline.start(_route(2), priority_min=-5)
    pipeline.accept(
        flow, AdmissionResult(AdmissionKind.DEGRADE, "total", degrade_to="low_priority")
    )
    assert flow.route.priority == -5
    flow = pipeline.start(_route(3))
    pipeline.accept(flow, AdmissionResult(AdmissionKind.DEGRADE, "total", degrade_to="async"))
    assert flow.run_async and not run_now(pipeline.release(flow))


def _sim_with_failure(**pipeline: object) -> ClusterSim:
    """node-1 dies before the first request: requests meet it as refused connections."""
    workload = generate_workload("hot-prefix", seed=4, requests=200)
    config = SimConfig(
        nodes=3,
        events=[ClusterEvent(0.0, "fail", "node-1")],
        pipeline=PipelineConfig.model_validate(pipeline),
        routing={"freshness_s": 60.0},  # reports go stale slowly: ejection does the work
    )
    sim = ClusterSim(workload, config, "hybrid")
    sim.run()
    return sim


def test_the_simulator_ejects_a_dead_node_through_the_pipeline() -> None:
    sim = _sim_with_failure()
    reg = sim.registry
    assert reg.get_sample_value("kvgate_outlier_ejections_total", {"node": "node-1", "reason": "connect"}) == 1  # fmt: skip
    # one request met the dead node (and was retried elsewhere); no other attempt did
    attempts = sum(
        s.value
        for f in reg.collect()
        for s in f.samples
        if s.name == "kvgate_dispatches_total" and s.labels["node"] == "node-1"
    )
    assert attempts == 1
    assert reg.get_sample_value("kvgate_retries_total", {"cause": "connect"}) == 1
    # probes (not requests) keep failing: it stays out, with its ejection growing
    assert (reg.get_sample_value("kvgate_outlier_probes_total", {"node": "node-1", "result": "failed"}) or 0) >= 2  # fmt: skip
    assert "node-1" in sim.pipeline.outlier.ejected()
    records = sim._records
    assert len(records) == 200 and all(r.http_status == 200 and r.node != "node-1" for r in records)


def test_the_simulator_honours_the_retry_budget() -> None:
    # an empty budget still lets a request leave a dead node: a refused connection adds no
    # load anywhere, and the budget guards against retry storms on an overloaded cluster
    spent = _sim_with_failure(retry_budget={"ratio": 0.0, "min_retries": 0})
    assert spent.registry.get_sample_value("kvgate_retry_budget_exhausted_total") == 0
    assert spent.registry.get_sample_value("kvgate_retries_total", {"cause": "connect"}) == 1
    assert all(r.http_status == 200 for r in spent._records)


def test_the_retry_budget_stops_overload_retries_but_not_dead_node_retries() -> None:
    pipeline = _pipeline()
    pipeline.budget = RetryBudget(ratio=0.0, window_s=10.0, min_retries=0)
    flow = pipeline.start(_route())
    decision = pipeline.next_attempt(flow)
    pipeline.attempt_failed(flow, decision, Failure("http_5xx", "node answered HTTP 503"))
    with pytest.raises(GiveUp, match="after 1 attempt"):
        pipeline.next_attempt(flow)
    assert pipeline.metrics.retry_budget_exhausted._value.get() == 1
    flow = pipeline.start(_route(1))
    decision = pipeline.next_attempt(flow)
    pipeline.attempt_failed(flow, decision, Failure("connect", "refused"))
    assert pipeline.next_attempt(flow).node_id != decision.node_id


def test_workloads_and_the_gateway_derive_one_route_key() -> None:
    from kvgate.routing import RouteKeyConfig, build_route_request

    items = generate_workload("tenant-prefix", seed=2, requests=6).items
    for config in (
        RouteKeyConfig(),
        RouteKeyConfig(kb_version="v7"),
        RouteKeyConfig(include_system_prompt=False),
    ):
        keys = set()
        for item in items:
            live = build_route_request(
                item.chat_body(),
                endpoint="chat",
                headers={},
                request_id=item.request_id,
                tenant=item.tenant,
                priority=0,
                config=config,
                model="served-model",
            )
            assert item.route_key("served-model", config) == live.route_key
            keys.add(live.route_key)
        if config.include_system_prompt:  # tenant-prefix: one system prompt per tenant
            assert len(keys) > 1
        else:
            assert len(keys) == 1
    assert items[0].route_key("m", RouteKeyConfig()) != items[0].route_key(
        "m", RouteKeyConfig(kb_version="v7")
    )
