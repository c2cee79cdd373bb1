"""The simulator's event loop: a heapq of arrivals, engine wake-ups and scrapes.

Production objects only: ``EngineCore`` per node, ``NodeView`` + ``Router`` (with the
policy under test) and a ``ManualClock`` that the loop sets to each event's time.
Engines are advanced only when one of their own events is due.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from kvgate.clock import ManualClock
from kvgate.engine.core import EngineCore
from kvgate.engine.profiles import get_profile
from kvgate.engine.request import EngineEvent, EngineRequest, EventKind
from kvgate.routing.config import RoutingConfig
from kvgate.routing.node_view import NodeView
from kvgate.routing.route_key import route_key
from kvgate.routing.router import Router
from kvgate.sim.reference_policies import OraclePolicy, SmgApproxPolicy
from kvgate.types import NodeReport, NodeSpec, NoNodeAvailable, RouteDecision, RouteRequest
from kvgate.workloads import PromptCache, Workload

REFERENCE_POLICIES = ("smg-approx", "oracle")
_ARRIVAL, _ENGINE, _SCRAPE, _EVENT = 0, 1, 2, 3
EVENT_KINDS = ("join", "fail", "flush")


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    tenant: str
    arrival: float
    prompt_tokens: int
    output_tokens: int
    node: str = ""
    expected_cached: int = 0
    cached_tokens: int = 0
    first_token: float | None = None
    finished: float | None = None
    rejected: bool = False
    retries: int = 0


@dataclass(slots=True)
class SimResult:
    policy: str
    nodes: int
    records: list[RequestRecord]
    load_samples: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    engine_hits: int = 0
    engine_queries: int = 0
    node_ids: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Flight:
    route: RouteRequest
    decision: RouteDecision
    record: RequestRecord


def simulate(
    workload: Workload,
    policy: str,
    *,
    nodes: int = 4,
    profile: str = "llama3-8b-h100",
    seed: int = 0,
    kv_blocks: int | None = None,
    scrape_interval_s: float | None = None,
    events: list[tuple[float, str, str]] | None = None,
) -> SimResult:
    clock = ManualClock()
    builtin = policy not in REFERENCE_POLICIES
    config = RoutingConfig(policy=policy if builtin else "round_robin")
    view = NodeView(clock, config)
    router = Router(
        config, view, clock=clock, registry=CollectorRegistry(), rng=random.Random(seed)
    )
    prof = get_profile(profile)
    engines: dict[str, EngineCore] = {}
    for i in range(nodes):
        engines[f"node-{i}"] = EngineCore(prof, kv_blocks=kv_blocks, token_events=False)
        view.add_node(NodeSpec(node_id=f"node-{i}", url=f"sim://node-{i}", engine_type="sim"))
    if policy == "oracle":
        router.policy = OraclePolicy(engines)
    elif policy == "smg-approx":
        router.policy = SmgApproxPolicy()
    interval = scrape_interval_s if scrape_interval_s is not None else config.scrape_interval_s

    prompts = PromptCache()
    heap: list[tuple[float, int, int, Any]] = []
    seq = 0
    wake_at: dict[str, float] = {}
    flights: dict[str, _Flight] = {}
    records: list[RequestRecord] = []
    result = SimResult(policy=policy, nodes=nodes, records=records)

    def push(t: float, kind: int, payload: Any) -> None:
        nonlocal seq
        heapq.heappush(heap, (t, seq, kind, payload))
        seq += 1

    def schedule_engine(node_id: str) -> None:
        t = engines[node_id].next_event_time()
        if t is not None and wake_at.get(node_id) != t:
            wake_at[node_id] = t
            push(t, _ENGINE, node_id)

    def handle(events: list[EngineEvent]) -> None:
        for ev in events:
            flight = flights.get(ev.request_id)
            if flight is None:
                continue
            rec = flight.record
            if ev.kind is EventKind.FIRST_TOKEN:
                rec.first_token = ev.time
                rec.cached_tokens = ev.cached_tokens
            elif ev.kind is EventKind.FINISHED:
                rec.finished = ev.time
                if rec.first_token is None:
                    rec.first_token = ev.time
                del flights[ev.request_id]
                router.on_complete(
                    flight.route,
                    flight.decision,
                    ok=True,
                    actual_cached_tokens=rec.cached_tokens,
                    output_tokens=rec.output_tokens,
                )
            elif ev.kind is EventKind.FAILED:
                del flights[ev.request_id]
                router.on_complete(
                    flight.route, flight.decision, ok=False, actual_cached_tokens=None
                )

    def dispatch(req: RouteRequest, rec: RequestRecord, t: float) -> None:
        try:
            decision = router.route(req)
        except NoNodeAvailable:
            rec.rejected = True
            return
        rec.node = decision.node_id
        rec.expected_cached = decision.expected_cached_tokens
        router.on_dispatch(req, decision)
        flights[req.request_id] = _Flight(req, decision, rec)
        engine = engines[decision.node_id]
        engine.add_request(
            EngineRequest(req.request_id, req.prompt_tokens, req.block_hashes, rec.output_tokens),
            t,
        )
        handle(engine.advance_to(t))
        schedule_engine(decision.node_id)

    def add_node(node_id: str) -> None:
        engines[node_id] = EngineCore(prof, kv_blocks=kv_blocks, token_events=False)
        view.add_node(NodeSpec(node_id=node_id, url=f"sim://{node_id}", engine_type="sim"))

    def apply_event(t: float, kind: str, node_id: str) -> None:
        if kind == "join":
            add_node(node_id or f"node-{len(engines)}")
        elif kind == "flush" and node_id in engines:
            engines[node_id].reset_prefix_cache()
        elif kind == "fail" and node_id in engines:
            engine = engines.pop(node_id)
            result.node_ids.append(node_id)
            wake_at.pop(node_id, None)
            view.remove_node(node_id)
            # the gateway retries what the dead node held: nothing is lost
            for flight in [f for f in flights.values() if f.decision.node_id == node_id]:
                engine.abort(flight.route.request_id)
                del flights[flight.route.request_id]
                router.on_complete(
                    flight.route, flight.decision, ok=False, actual_cached_tokens=None
                )
                flight.record.retries += 1
                flight.record.first_token = None
                dispatch(flight.route, flight.record, t)

    for t_ev, kind_ev, node_ev in events if events is not None else workload.events:
        if kind_ev not in EVENT_KINDS:
            raise ValueError(f"event: unknown kind {kind_ev!r}; known: {', '.join(EVENT_KINDS)}")
        push(t_ev, _EVENT, (kind_ev, node_ev))

    for idx, item in enumerate(workload.items):
        push(item.arrival, _ARRIVAL, idx)
    push(0.0, _SCRAPE, None)
    remaining = len(workload.items)

    while heap:
        t, _, kind, payload = heapq.heappop(heap)
        clock.set(max(t, clock.now()))
        if kind == _ARRIVAL:
            remaining -= 1
            item = workload.items[payload]
            tp = prompts.prompt(item)
            req = RouteRequest(
                request_id=item.request_id,
                model=item.model,
                prompt_tokens=tp.prompt_tokens,
                block_hashes=tp.block_hashes,
                route_key=route_key(item.model, tp.stable_digest),
                max_tokens=item.max_tokens,
                tenant=item.tenant,
            )
            rec = RequestRecord(item.request_id, item.tenant, t, tp.prompt_tokens, item.max_tokens)
            records.append(rec)
            dispatch(req, rec, t)
        elif kind == _ENGINE:
            if wake_at.get(payload) != t:
                continue  # superseded wake-up
            del wake_at[payload]
            handle(engines[payload].advance_to(t))
            schedule_engine(payload)
        elif kind == _EVENT:
            apply_event(t, payload[0], payload[1])
        else:
            loads: dict[str, int] = {}
            for node_id, engine in engines.items():
                st = engine.stats()
                loads[node_id] = st.running + st.waiting
                view.apply_report(
                    NodeReport(
                        node_id=node_id,
                        timestamp=t,
                        running=st.running,
                        waiting=st.waiting,
                        kv_usage=st.kv_usage,
                        engine_type="sim",
                    )
                )
            result.load_samples.append((t, loads))
            if remaining or flights:
                push(t + interval, _SCRAPE, None)

    result.node_ids = sorted(set(result.node_ids) | set(engines))
    for engine in engines.values():
        st = engine.stats()
        result.engine_hits += st.prefix_cache_hits
        result.engine_queries += st.prefix_cache_queries
    return result
