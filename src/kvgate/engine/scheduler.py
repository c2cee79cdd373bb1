"""Continuous batching (vLLM v1 scheduler shape).

Each step has a token budget (``max_num_batched_tokens``). Running requests are served
first, in order: one token for a decoding request, the next prompt chunk for a
prefilling one (chunked prefill). When blocks run out the last running request is
preempted by recompute: its blocks are freed and it goes back to the front of the
waiting queue. If nothing was preempted, waiting requests are admitted FCFS while
``max_num_seqs`` and the budget allow, each reusing its cached prefix blocks.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from kvgate.engine.kv_cache import KVCacheManager, blocks_for
from kvgate.engine.profiles import Profile
from kvgate.engine.request import Sequence


@dataclass(slots=True)
class StepPlan:
    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    num_tokens: int = 0
    kv_tokens: int = 0
    admitted: int = 0
    pure_decode: bool = False  # every running request decodes one token; nothing changes

    @property
    def num_seqs(self) -> int:
        return len(self.scheduled)


@dataclass(slots=True)
class SchedulerCounters:
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_hits: int = 0  # of which found cached
    preemptions: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: int = 0
    aborted: int = 0


class Scheduler:
    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.kv = KVCacheManager(profile.num_gpu_blocks, profile.block_size)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.counters = SchedulerCounters()

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def _preempt(self, seq: Sequence) -> None:
        self.kv.free(seq.request_id)
        seq.num_computed = 0
        seq.num_hashed_blocks = 0
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)
        self.counters.preemptions += 1

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        budget = self.profile.max_num_batched_tokens
        kv = self.kv
        running = self.running
        all_decode = True
        bs = self.profile.block_size
        scheduled = plan.scheduled
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            computed = seq.num_computed
            new = seq.num_tokens - computed
            if new == 1 and computed % bs and seq.num_output:
                # Decode with room left in the last block: no allocation (the hot path).
                scheduled.append((seq, 1))
                plan.num_tokens += 1
                plan.kv_tokens += computed + 1
                budget -= 1
                i += 1
                continue
            if new > budget:
                new = budget
            while not kv.allocate(seq.request_id, seq.num_computed + new):
                victim = running.pop()
                self._preempt(victim)
                plan.preempted.append(victim)
                if victim is seq:
                    break
            else:
                plan.scheduled.append((seq, new))
                plan.num_tokens += new
                plan.kv_tokens += seq.num_computed + new
                budget -= new
                if new != 1 or seq.num_output == 0:
                    all_decode = False
                i += 1
                continue
            break  # the current request itself was preempted
        if i < len(running):
            all_decode = False  # budget ran out before every running request was served

        if not plan.preempted:
            self._admit(plan, budget)
        plan.pure_decode = (
            all_decode and not plan.preempted and plan.admitted == 0 and bool(plan.scheduled)
        )
        return plan

    def _admit(self, plan: StepPlan, budget: int) -> None:
        kv = self.kv
        bs = self.profile.block_size
        while self.waiting and budget > 0 and len(self.running) < self.profile.max_num_seqs:
            seq = self.waiting[0]
            cached = kv.cached_prefix_blocks(seq.req.block_hashes, seq.num_tokens)
            num_cached = len(cached) * bs
            new = min(seq.num_tokens - num_cached, budget)
            if not kv.allocate(seq.request_id, num_cached + new, cached):
                break
            self.waiting.popleft()
            self.running.append(seq)
            seq.num_computed = num_cached
            seq.num_hashed_blocks = len(cached)
            if seq.cached_tokens < 0:
                seq.cached_tokens = num_cached
                self.counters.prefix_queries += seq.req.prompt_tokens
                self.counters.prefix_hits += num_cached
            plan.scheduled.append((seq, new))
            plan.num_tokens += new
            plan.kv_tokens += num_cached + new
            plan.admitted += 1
            budget -= new

    def decode_steps_possible(self, max_steps: int) -> int:
        """How many pure-decode steps (1..max_steps) fit in the free blocks.

        Called after ``schedule`` allocated the first of them.
        """
        bs = self.profile.block_size
        tables = self.kv.tables
        free = self.kv.pool.num_free
        seqs = [(s.num_computed, len(tables[s.request_id])) for s in self.running]

        def need(k: int) -> int:
            total = 0
            for computed, have in seqs:
                extra = blocks_for(computed + k, bs) - have
                if extra > 0:
                    total += extra
            return total

        if need(max_steps) <= free:
            return max_steps
        lo, hi = 1, max_steps  # need(lo) <= free (already allocated), need(hi) > free
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if need(mid) <= free:
                lo = mid
            else:
                hi = mid
        return lo

    def remove(self, seq: Sequence) -> None:
        """Drop a finished or aborted request and free its blocks."""
        seq.done = True
        self.kv.free(seq.request_id)
