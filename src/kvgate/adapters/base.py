"""Engine adapters: one engine's /metrics text → one normalised ``NodeReport``.

Each engine names things differently; an adapter's only job is ``observe``: read the
engine's metric set into an ``Observation``. What is common to all engines — counter
rates against the previous report, restart detection, the stale report for a failed
scrape — lives here, once.

Adapters never raise: a failed or unparsable scrape becomes ``NodeReport(stale=True)``
carrying the previous counters forward, so the next good scrape still gets rates and a
restart is still noticed across a failed scrape.
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import aiohttp

from kvgate.adapters.prom import MetricSet, parse_metrics
from kvgate.types import NodeReport

log = logging.getLogger(__name__)

# Sample lines no adapter reads (histogram buckets, the client library's *_created
# timestamps): skipped unparsed on each scrape, a large share of an engine's /metrics.
UNUSED_SAMPLES = ("_bucket", "_created")

# Counters kept in NodeReport.extra. The prefix pair is read by kvgate.report_window.
PROMPT_TOKENS = "prompt_tokens_total"
GENERATION_TOKENS = "generation_tokens_total"
PREFIX_QUERIES = "prefix_queries_total"
PREFIX_HITS = "prefix_hits_total"
PREEMPTIONS = "preemptions_total"
REQUESTS = "requests_total"  # finished requests; only used to notice counter resets
COUNTER_KEYS = (
    PROMPT_TOKENS,
    GENERATION_TOKENS,
    PREFIX_QUERIES,
    PREFIX_HITS,
    PREEMPTIONS,
    REQUESTS,
)
# When the counters in ``extra`` were read (a stale report carries older ones forward).
COUNTERS_AT = "counters_timestamp"

# Counters are floats in the exposition format; allow for rounding when comparing.
_RESET_TOLERANCE = 1e-6


class ScrapeError(RuntimeError):
    """The engine did not answer with usable metrics (HTTP error, timeout, bad body)."""


class MissingMetric(ValueError):
    """A metric every scrape of this engine must contain is absent."""


@dataclass(slots=True)
class Observation:
    """What one scrape says, in kvgate's units, before comparison with the previous one."""

    running: float
    waiting: float
    kv_usage: float | None = None  # 0..1; None when the engine does not expose it
    kv_capacity_tokens: int | None = None
    prefix_hit_rate: float | None = None  # an engine-computed gauge, when there is one
    process_start_time: float | None = None
    counters: dict[str, float] = field(default_factory=dict)  # COUNTER_KEYS subset
    extra: dict[str, float] = field(default_factory=dict)  # engine-specific extras


def require(metrics: MetricSet, *names: str) -> float:
    """The total of the first of ``names`` present, or MissingMetric."""
    value = metrics.first_total(names)
    if value is None:
        raise MissingMetric(f"none of {', '.join(names)} in the scrape")
    return value


def finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def clamp01(value: float | None) -> float | None:
    value = finite(value)
    return None if value is None else max(0.0, min(1.0, value))


class EngineAdapter(ABC):
    engine_type: ClassVar[str]
    metrics_path: ClassVar[str] = "/metrics"

    @abstractmethod
    def observe(self, metrics: MetricSet) -> Observation:
        """Read the engine's metrics; raise (MissingMetric, ValueError) if unusable."""

    # ---- parsing -------------------------------------------------------------------

    def parse(
        self,
        metrics_text: str,
        *,
        node_id: str,
        now: float,
        previous: NodeReport | None = None,
        **extra: Any,
    ) -> NodeReport:
        """A report from /metrics text; ``extra``: what ``fetch_extra`` read besides."""
        try:
            observation = self.observe(parse_metrics(metrics_text, skip_suffixes=UNUSED_SAMPLES))
        except Exception as exc:  # never raise: a bad scrape is a stale report
            log.debug("node %s: unusable %s metrics: %s", node_id, self.engine_type, exc)
            return self.stale_report(node_id=node_id, now=now, previous=previous)
        if extra:
            self.observe_extra(observation, extra, node_id=node_id)
        return self.build_report(observation, node_id=node_id, now=now, previous=previous)

    def observe_extra(self, obs: Observation, extra: dict[str, Any], *, node_id: str) -> None:  # noqa: B027
        """Complete ``obs`` from ``fetch_extra``'s answers (engines whose /metrics lacks
        something); never raises. Nothing here."""

    def build_report(
        self,
        obs: Observation,
        *,
        node_id: str,
        now: float,
        previous: NodeReport | None,
    ) -> NodeReport:
        prev_counters = _counters_of(previous)
        reset = _restarted(obs, previous, prev_counters)
        extra = dict(obs.extra)
        extra.update(obs.counters)
        extra[COUNTERS_AT] = now
        report = NodeReport(
            node_id=node_id,
            timestamp=now,
            running=max(0.0, obs.running),
            waiting=max(0.0, obs.waiting),
            kv_usage=clamp01(obs.kv_usage) or 0.0,
            kv_capacity_tokens=obs.kv_capacity_tokens,
            prefix_hit_rate=clamp01(obs.prefix_hit_rate),
            preemptions_total=obs.counters.get(PREEMPTIONS, 0.0),
            process_start_time=obs.process_start_time,
            counters_reset=reset,
            engine_type=self.engine_type,
            extra=extra,
        )
        if previous is None or reset:
            # Nothing to difference against yet: the hit rate since the engine started.
            if report.prefix_hit_rate is None:
                report.prefix_hit_rate = _lifetime_hit_rate(obs.counters)
            return report
        since = previous.extra.get(COUNTERS_AT, previous.timestamp)
        dt = now - since
        if dt <= 0:
            return report
        report.prompt_tokens_rate = _rate(obs.counters, prev_counters, PROMPT_TOKENS, dt)
        report.generation_tokens_rate = _rate(obs.counters, prev_counters, GENERATION_TOKENS, dt)
        if report.prefix_hit_rate is None:
            report.prefix_hit_rate = _delta_hit_rate(obs.counters, prev_counters, previous)
        return report

    def stale_report(
        self, *, node_id: str, now: float, previous: NodeReport | None = None
    ) -> NodeReport:
        report = NodeReport(
            node_id=node_id, timestamp=now, stale=True, engine_type=self.engine_type
        )
        if previous is not None:
            report.extra = {k: v for k, v in previous.extra.items() if k in COUNTER_KEYS}
            report.extra[COUNTERS_AT] = previous.extra.get(COUNTERS_AT, previous.timestamp)
            report.process_start_time = previous.process_start_time
            report.preemptions_total = previous.preemptions_total
            report.kv_capacity_tokens = previous.kv_capacity_tokens
        return report

    # ---- scraping ------------------------------------------------------------------

    async def scrape(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        *,
        node_id: str,
        now: float,
        previous: NodeReport | None = None,
        timeout_s: float = 2.0,
    ) -> NodeReport:
        try:
            text = await fetch_text(session, join_url(base_url, self.metrics_path), timeout_s)
        except Exception as exc:  # never raise: an unreachable engine is a stale report
            log.debug("node %s: scrape failed: %s", node_id, exc)
            return self.stale_report(node_id=node_id, now=now, previous=previous)
        extra = await self.fetch_extra(session, base_url, node_id=node_id, timeout_s=timeout_s)
        return self.parse(text, node_id=node_id, now=now, previous=previous, **extra)

    async def fetch_extra(
        self, session: aiohttp.ClientSession, base_url: str, *, node_id: str, timeout_s: float
    ) -> dict[str, Any]:
        """Keyword arguments for ``parse`` from endpoints other than /metrics (none here)."""
        return {}


def join_url(base_url: str, path: str) -> str:
    return base_url.rstrip("/") + path


async def fetch_text(session: aiohttp.ClientSession, url: str, timeout_s: float) -> str:
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with session.get(url, timeout=timeout) as resp:
            body = await resp.read()
            if resp.status != 200:
                raise ScrapeError(f"GET {url}: HTTP {resp.status}")
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise ScrapeError(f"GET {url}: {type(exc).__name__}: {exc}") from exc
    return body.decode("utf-8", errors="replace")


def _counters_of(report: NodeReport | None) -> dict[str, float]:
    if report is None:
        return {}
    return {k: v for k, v in report.extra.items() if k in COUNTER_KEYS}


def _restarted(obs: Observation, previous: NodeReport | None, prev: dict[str, float]) -> bool:
    if previous is None:
        return False
    start, prev_start = obs.process_start_time, previous.process_start_time
    if start is not None and prev_start is not None and abs(start - prev_start) > 1e-3:
        return True
    return any(
        obs.counters[k] < prev[k] - _RESET_TOLERANCE for k in obs.counters.keys() & prev.keys()
    )


def _rate(cur: dict[str, float], prev: dict[str, float], key: str, dt: float) -> float:
    if key not in cur or key not in prev:
        return 0.0
    return max(0.0, (cur[key] - prev[key]) / dt)


def _delta_hit_rate(
    cur: dict[str, float], prev: dict[str, float], previous: NodeReport
) -> float | None:
    if not {PREFIX_QUERIES, PREFIX_HITS} <= cur.keys() & prev.keys():
        return None
    queries = cur[PREFIX_QUERIES] - prev[PREFIX_QUERIES]
    hits = cur[PREFIX_HITS] - prev[PREFIX_HITS]
    if queries <= 0:
        # No traffic since the last scrape: the last known rate still stands.
        return previous.prefix_hit_rate
    return max(0.0, min(1.0, hits / queries))


def _lifetime_hit_rate(cur: dict[str, float]) -> float | None:
    queries, hits = cur.get(PREFIX_QUERIES), cur.get(PREFIX_HITS)
    if queries is None or hits is None or queries <= 0:
        return None
    return max(0.0, min(1.0, hits / queries))
