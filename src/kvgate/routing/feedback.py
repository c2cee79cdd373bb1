"""Hit feedback: are the cache hits the router predicts actually happening?

Three levels:

1. Per routed request: expected cached tokens (the router's prediction) vs the engine's
   ``usage.prompt_tokens_details.cached_tokens`` — totals per node and an EWMA of the
   actual/expected ratio per (node, route key).
2. Per node: the engine's own prefix hit rate (``NodeReport.prefix_hit_rate``), read from
   the node view when a snapshot is taken.
3. Demotion: after ``demote_after`` consecutive shortfalls (actual below
   ``shortfall_fraction`` × expected) — or at once on a full miss (nothing cached where a
   hit was predicted: the node lost the prefix, e.g. a cache reset or eviction, when
   ``demote_on_full_miss``) — a (node, route key) pair is demoted: the router stops
   treating that node as a cache holder for that prefix. It is restored as soon as a
   request for the prefix on that node reports cached tokens again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(slots=True)
class PairStats:
    ratio_ewma: float = 1.0
    consecutive_shortfalls: int = 0
    demoted: bool = False
    samples: int = 0


@dataclass(slots=True)
class NodeHitTotals:
    requests: int = 0
    expected_cached_tokens: int = 0
    actual_cached_tokens: int = 0
    prompt_tokens: int = 0
    demotions: int = 0

    @property
    def predicted_hit_rate(self) -> float | None:
        return self.expected_cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    @property
    def actual_hit_rate(self) -> float | None:
        return self.actual_cached_tokens / self.prompt_tokens if self.prompt_tokens else None


@dataclass(eq=False, kw_only=True)
class HitFeedback:
    shortfall_fraction: float = 0.5
    demote_after: int = 3
    ewma_alpha: float = 0.2
    max_entries: int = 100_000
    demote_on_full_miss: bool = True
    on_demote: Callable[[str, str], None] | None = None
    _pairs: OrderedDict[tuple[str, str], PairStats] = field(
        default_factory=OrderedDict, init=False, repr=False
    )
    nodes: dict[str, NodeHitTotals] = field(default_factory=dict, init=False, repr=False)

    def is_demoted(self, node_id: str, route_key: str) -> bool:
        stats = self._pairs.get((node_id, route_key))
        return stats is not None and stats.demoted

    def pair(self, node_id: str, route_key: str) -> PairStats | None:
        return self._pairs.get((node_id, route_key))

    def record(
        self,
        node_id: str,
        route_key: str,
        *,
        expected_cached_tokens: int,
        actual_cached_tokens: int | None,
        prompt_tokens: int,
        demotion_enabled: bool = True,
    ) -> str | None:
        """Fold in one completed request; returns "demoted" / "restored" on a change."""
        if actual_cached_tokens is None:
            return None  # the engine did not report cached tokens: nothing to compare
        totals = self.nodes.setdefault(node_id, NodeHitTotals())
        totals.requests += 1
        totals.expected_cached_tokens += expected_cached_tokens
        totals.actual_cached_tokens += actual_cached_tokens
        # ``prompt_tokens`` is the router's estimate; the engine's own tokenizer may count
        # more. A prompt had at least as many tokens as the engine found cached, so the
        # rates stay rates (<= 1) however far the estimate is off.
        totals.prompt_tokens += max(prompt_tokens, actual_cached_tokens, expected_cached_tokens)
        key = (node_id, route_key)
        stats = self._pairs.get(key)
        if stats is None:
            if expected_cached_tokens <= 0:
                return None  # never predicted: nothing to track for this pair
            stats = self._pairs[key] = PairStats()
            while len(self._pairs) > self.max_entries:
                self._pairs.popitem(last=False)
        else:
            self._pairs.move_to_end(key)
        if stats.demoted:
            if actual_cached_tokens > 0:
                stats.demoted = False
                stats.consecutive_shortfalls = 0
                stats.ratio_ewma = 1.0
                return "restored"
            return None
        if expected_cached_tokens <= 0:
            return None
        ratio = min(1.0, actual_cached_tokens / expected_cached_tokens)
        stats.samples += 1
        stats.ratio_ewma += self.ewma_alpha * (ratio - stats.ratio_ewma)
        if actual_cached_tokens < self.shortfall_fraction * expected_cached_tokens:
            stats.consecutive_shortfalls += 1
        else:
            stats.consecutive_shortfalls = 0
        full_miss = self.demote_on_full_miss and actual_cached_tokens == 0
        if demotion_enabled and (full_miss or stats.consecutive_shortfalls >= self.demote_after):
            stats.demoted = True
            totals.demotions += 1
            if self.on_demote:
                self.on_demote(node_id, route_key)
            return "demoted"
        return None

    def forget_node(self, node_id: str) -> None:
        for key in [k for k in self._pairs if k[0] == node_id]:
            del self._pairs[key]

    def demoted_count(self) -> int:
        return sum(1 for s in self._pairs.values() if s.demoted)
