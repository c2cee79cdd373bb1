"""The gateway's view of its nodes: specs, smoothed reports, in-flight ledger and states.

State machine::

    healthy ─► backoff (only requests under backoff_token_threshold)
       ▲    ─► quiescing (no new requests; in-flight ones finish)
       │    ─► re-register (restart seen: index entries purged, cold boost restarts)
       └──────── next normal report ◄┘
    any ─► unreachable (no fresh report within freshness_s) ─► back once a report arrives

States come from the admin API (sticky), sidecar state hints (``NodeReport.state_hint``,
revert to healthy when the hint goes away) or automatic detection (restart, freshness).
"""

from __future__ import annotations

import builtins
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from operator import attrgetter

from kvgate.clock import Clock
from kvgate.report_window import ReportWindow
from kvgate.routing.cold_boost import cold_boost
from kvgate.routing.config import RoutingConfig
from kvgate.routing.load_score import load_score
from kvgate.types import NodeReport, NodeSpec, NodeState

_node_id = attrgetter("spec.node_id")
_OVERLAID = frozenset({NodeState.HEALTHY, NodeState.REREGISTER})


class UnknownNode(KeyError):
    pass


@dataclass(slots=True)
class InFlight:
    prompt_tokens: int
    generated_tokens: int = 0


@dataclass(slots=True)
class NodeEntry:
    spec: NodeSpec
    view: NodeView
    base_state: NodeState = NodeState.HEALTHY
    state_source: str = "auto"  # "auto" | "hint" | "admin"
    report: NodeReport | None = None  # latest smoothed report
    window: ReportWindow = field(default_factory=ReportWindow)
    added_at: float = 0.0
    registered_at: float = 0.0  # cold boost starts here
    last_report_at: float | None = None  # clock time of the last non-stale report
    unreachable_since: float | None = None  # explicit set_state(UNREACHABLE)
    process_start_time: float | None = None
    inflight: dict[str, InFlight] = field(default_factory=dict)
    inflight_tokens: int = 0
    # dispatched after the last report, so not yet in the engine's running/waiting
    unreported: set[str] = field(default_factory=set)
    # the cached load score: recomputed at dispatch and completion, and on first read
    # after progress (a stream reports progress several times between two decisions)
    cached_load: float = 0.0
    load_stale: bool = False

    @property
    def load(self) -> float:
        if self.load_stale:
            self.view.refresh_loads()
        return self.cached_load

    @property
    def node_id(self) -> str:
        return self.spec.node_id

    @property
    def kv_capacity_tokens(self) -> int | None:
        """The engine's KV capacity: as last reported, else as configured."""
        report = self.report
        return (report.kv_capacity_tokens if report else None) or self.spec.kv_capacity_tokens

    @property
    def inflight_requests(self) -> int:
        return len(self.inflight)

    @property
    def state(self) -> NodeState:
        return self.view.state_of(self.spec.node_id)

    @property
    def cold_boost(self) -> float:
        return self.view.cold_boost(self.spec.node_id)


@dataclass(slots=True)
class EligibleSet:
    """The filters' verdict (routing/filters.py) for one kind of request (pool, model,
    size, endpoint), before exclusions.

    Kept in ``NodeView.eligibility`` and reused until the node view changes what a
    filter reads (it then clears them all), the configuration is swapped, the clock goes
    back, or the oldest fresh report ages past ``freshness_s``; ``loads`` follows every
    load change (``NodeView._recompute_load``). A decision so costs a copy, not a pass
    over every node.
    """

    config: RoutingConfig
    computed_at: float
    oldest_fresh: float  # the oldest report time that passed the freshness test
    entries: list[NodeEntry]
    loads: dict[str, float]  # the entries' load scores, same order
    dropped: dict[str, int]
    dropped_by: dict[str, str]  # node id → the filter that removed it

    def valid(self, config: RoutingConfig, now: float) -> bool:
        return (
            self.config is config
            and now >= self.computed_at
            and self.oldest_fresh >= now - config.freshness_s  # the state filter's own test
        )


class NodeView:
    def __init__(self, clock: Clock, config: RoutingConfig | None = None) -> None:
        self.clock = clock
        self.config = config or RoutingConfig()
        self._nodes: dict[str, NodeEntry] = {}
        self._on_reregister: list[Callable[[str], None]] = []
        self._on_remove: list[Callable[[str], None]] = []
        self._on_add: list[Callable[[str], None]] = []
        # (node id, report, requests dispatched since the previous report)
        self._on_report: list[Callable[[str, NodeReport, int], None]] = []
        self._newest_registration = float("-inf")
        self._registrations: Counter[float] = Counter()  # registered_at → nodes
        # a state reported by another mechanism over a routable node (the pipeline's
        # outlier detector: an ejected node reads as backoff); None: no overlay
        self.overlay: Callable[[str], NodeState | None] | None = None
        # the filters' verdicts per request kind (routing/filters.py), cleared whenever
        # something a filter reads changes; their load scores follow every load change
        # (a progress update's when they are next read: ``eligibility``)
        self._eligibility: dict[tuple[object, ...], EligibleSet] = {}
        self._stale_loads: list[NodeEntry] = []  # entries whose progress changed their load

    @property
    def eligibility(self) -> dict[tuple[object, ...], EligibleSet]:
        if self._stale_loads:
            self.refresh_loads()
        return self._eligibility

    def refresh_loads(self) -> None:
        """Recompute the load scores progress updates left stale (readers call it)."""
        stale, self._stale_loads = self._stale_loads, []
        for entry in stale:
            if entry.load_stale:
                self._recompute_load(entry)

    # -- listeners ---------------------------------------------------------------------
    def subscribe(
        self,
        *,
        on_add: Callable[[str], None] | None = None,
        on_remove: Callable[[str], None] | None = None,
        on_reregister: Callable[[str], None] | None = None,
        on_report: Callable[[str, NodeReport, int], None] | None = None,
    ) -> None:
        if on_report:
            self._on_report.append(on_report)
        if on_add:
            self._on_add.append(on_add)
        if on_remove:
            self._on_remove.append(on_remove)
        if on_reregister:
            self._on_reregister.append(on_reregister)

    # -- admin -------------------------------------------------------------------------
    def add_node(self, spec: NodeSpec) -> NodeEntry:
        self.eligibility.clear()
        existing = self._nodes.get(spec.node_id)
        if existing is not None:
            existing.spec = spec
            return existing
        now = self.clock.now()
        entry = NodeEntry(
            spec=spec,
            view=self,
            window=ReportWindow(self.config.smoothing_window_s),
            added_at=now,
            registered_at=now,
        )
        self._nodes[spec.node_id] = entry
        self._newest_registration = now
        self._registrations[now] += 1
        for cb in self._on_add:
            cb(spec.node_id)
        return entry

    def remove_node(self, node_id: str) -> None:
        entry = self._nodes.pop(node_id, None)
        if entry is None:
            return
        self.eligibility.clear()
        self._unregister(entry.registered_at)
        for cb in self._on_remove:
            cb(node_id)

    def set_state(self, node_id: str, state: NodeState | str, *, source: str = "admin") -> None:
        entry = self._require(node_id)
        state = NodeState(state)
        self.eligibility.clear()
        if source == "admin" and entry.report is not None and entry.report.state_hint == state:
            source = "hint"  # the registry relaying a sidecar hint, not an operator decision
        if state == NodeState.REREGISTER:
            self._reregister(entry)
            return
        if state == NodeState.UNREACHABLE:
            entry.unreachable_since = self.clock.now()
            return
        entry.unreachable_since = None
        entry.base_state = state
        entry.state_source = "auto" if state == NodeState.HEALTHY else source

    def get(self, node_id: str) -> NodeEntry | None:
        return self._nodes.get(node_id)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._nodes

    def __iter__(self) -> Iterator[NodeEntry]:
        return iter(list(self._nodes.values()))

    def __len__(self) -> int:
        return len(self._nodes)

    def entries(self) -> Iterable[NodeEntry]:
        """A live view of the entries (do not add or remove nodes while iterating)."""
        return self._nodes.values()

    def list(self) -> builtins.list[NodeEntry]:
        return list(self._nodes.values())

    @property
    def node_ids(self) -> builtins.list[str]:
        return list(self._nodes)

    # -- reports -----------------------------------------------------------------------
    def apply_report(self, report: NodeReport) -> NodeEntry | None:
        """Fold one report into the view; reports for unknown nodes are ignored."""
        entry = self._nodes.get(report.node_id)
        if entry is None:
            return None
        self.eligibility.clear()
        now = self.clock.now()
        restarted = report.counters_reset or (
            entry.process_start_time is not None
            and report.process_start_time is not None
            and report.process_start_time != entry.process_start_time
        )
        if report.process_start_time is not None:
            entry.process_start_time = report.process_start_time
        if restarted:
            self._reregister(entry)
        elif entry.base_state == NodeState.REREGISTER and not report.stale:
            entry.base_state, entry.state_source = NodeState.HEALTHY, "auto"
        entry.report = entry.window.add(report)
        dispatched_since = len(entry.unreported)
        if not report.stale:
            entry.last_report_at = now
            entry.unreachable_since = None
            entry.unreported.clear()
            self._apply_hint(entry, report.state_hint)
        self._recompute_load(entry)
        for cb in self._on_report:
            cb(entry.spec.node_id, report, dispatched_since)
        return entry

    def _apply_hint(self, entry: NodeEntry, hint: NodeState | None) -> None:
        if entry.state_source == "admin":
            return
        if hint in (NodeState.BACKOFF, NodeState.QUIESCING):
            entry.base_state, entry.state_source = hint, "hint"
        elif hint == NodeState.REREGISTER:
            self._reregister(entry)
        elif entry.state_source == "hint":
            entry.base_state, entry.state_source = NodeState.HEALTHY, "auto"

    def _reregister(self, entry: NodeEntry) -> None:
        self.eligibility.clear()
        entry.base_state, entry.state_source = NodeState.REREGISTER, "auto"
        self._unregister(entry.registered_at)
        entry.registered_at = self._newest_registration = self.clock.now()
        self._registrations[entry.registered_at] += 1
        entry.unreachable_since = None
        entry.window.clear()
        for cb in self._on_reregister:
            cb(entry.spec.node_id)

    def _unregister(self, registered_at: float) -> None:
        left = self._registrations[registered_at] - 1
        if left:
            self._registrations[registered_at] = left
        else:
            del self._registrations[registered_at]

    # -- derived -----------------------------------------------------------------------
    def _require(self, node_id: str) -> NodeEntry:
        entry = self._nodes.get(node_id)
        if entry is None:
            raise UnknownNode(node_id)
        return entry

    def common_boost(self) -> float | None:
        """The cold boost every node has now, or None when they differ."""
        now = self.clock.now()
        warmup = self.config.warmup_s
        if now - self._newest_registration >= warmup:
            return 0.0
        if len(self._registrations) != 1:
            return None
        age = now - next(iter(self._registrations))
        return 1.0 - max(0.0, age) / warmup if age < warmup else 0.0

    def boosts(self, entries: Iterable[NodeEntry]) -> dict[str, float]:
        """Cold boost of each entry (fast path for a routing decision)."""
        now = self.clock.now()
        warmup = self.config.warmup_s
        common = self.common_boost()  # nobody warming up, or registered together
        if common is not None:
            return dict.fromkeys(map(_node_id, entries), common)
        out: dict[str, float] = {}
        for e in entries:
            age = now - e.registered_at
            out[e.spec.node_id] = 1.0 - max(0.0, age) / warmup if age < warmup else 0.0
        return out

    def is_fresh(self, entry: NodeEntry, now: float) -> bool:
        if entry.unreachable_since is not None:
            return False
        seen = entry.last_report_at if entry.last_report_at is not None else entry.added_at
        return now - seen <= self.config.freshness_s

    def state_of(self, node_id: str) -> NodeState:
        entry = self._require(node_id)
        if not self.is_fresh(entry, self.clock.now()):
            return NodeState.UNREACHABLE
        if self.overlay is not None and entry.base_state in _OVERLAID:
            return self.overlay(node_id) or entry.base_state
        return entry.base_state

    def load(self, node_id: str) -> float:
        return self._require(node_id).load

    def cold_boost(self, node_id: str) -> float:
        entry = self._require(node_id)
        return cold_boost(self.clock.now() - entry.registered_at, self.config.warmup_s)

    def _recompute_load(self, entry: NodeEntry) -> None:
        entry.load_stale = False
        load = entry.cached_load = load_score(
            entry.report,
            unreported=len(entry.unreported),
            inflight_requests=len(entry.inflight),
            inflight_tokens=entry.inflight_tokens,
            config=self.config,
        )
        node_id = entry.spec.node_id
        for verdict in self._eligibility.values():
            if node_id in verdict.loads:
                verdict.loads[node_id] = load

    # -- in-flight ledger ----------------------------------------------------------------
    def on_dispatch(self, node_id: str, request_id: str, prompt_tokens: int) -> None:
        entry = self._nodes.get(node_id)
        if entry is None:
            return
        previous = entry.inflight.pop(request_id, None)
        if previous is not None:
            entry.inflight_tokens -= previous.prompt_tokens + previous.generated_tokens
        entry.inflight[request_id] = InFlight(prompt_tokens)
        entry.inflight_tokens += prompt_tokens
        entry.unreported.add(request_id)
        self._recompute_load(entry)

    def on_progress(self, node_id: str, request_id: str, generated_tokens: int) -> None:
        entry = self._nodes.get(node_id)
        flight = entry.inflight.get(request_id) if entry else None
        if entry is None or flight is None:
            return
        delta = max(0, generated_tokens - flight.generated_tokens)
        if not delta:
            return
        flight.generated_tokens += delta
        entry.inflight_tokens += delta
        if not entry.load_stale:
            entry.load_stale = True
            self._stale_loads.append(entry)

    def on_complete(self, node_id: str, request_id: str) -> None:
        entry = self._nodes.get(node_id)
        flight = entry.inflight.pop(request_id, None) if entry else None
        if entry is None or flight is None:
            return
        entry.inflight_tokens -= flight.prompt_tokens + flight.generated_tokens
        entry.unreported.discard(request_id)
        self._recompute_load(entry)
