"""EngineCore: the engine model driven by time, with no asyncio inside.

The owner adds requests at a time and calls ``advance_to(t)``; the core runs every step
that ends by ``t`` and returns the events. A real-time server and the virtual-time
cluster simulator drive the same object.

Cost is O(events), not O(steps): when a step is a pure decode of the whole running batch
and nothing can change (no admission, no preemption), the following identical steps are
run as one *decode run* whose duration has a closed form. The run ends at the first
finish or when blocks would run out; an arrival or abort cuts it at the step in
progress. Partial progress of a run is applied on ``advance_to`` so streaming sees
tokens step by step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence as Seq
from dataclasses import dataclass

from kvgate.engine.profiles import Profile
from kvgate.engine.request import EngineEvent, EngineRequest, EventKind, Sequence
from kvgate.engine.scheduler import Scheduler, StepPlan

_EPS = 1e-12


@dataclass(slots=True, frozen=True)
class EngineStats:
    running: int
    waiting: int
    kv_usage: float
    num_gpu_blocks: int
    num_free_blocks: int
    prefix_cache_queries: int  # tokens
    prefix_cache_hits: int  # tokens
    preemptions: int
    prompt_tokens: int
    generation_tokens: int
    finished: int
    aborted: int
    steps: int


@dataclass(slots=True)
class _InFlight:
    plan: StepPlan
    start: float
    steps: int  # 1, or the length of a decode run
    end: float
    first_end: float
    batch: int = 0
    kv0: int = 0


class EngineCore:
    def __init__(
        self,
        profile: Profile,
        *,
        kv_blocks: int | None = None,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        max_model_len: int | None = None,
        fast_forward: bool = True,
        token_events: bool = True,
    ) -> None:
        """``token_events=False`` drops TOKENS events (a simulator that only needs first
        token and finish times saves one event per running request per step)."""
        self.profile = profile.with_overrides(
            kv_blocks=kv_blocks,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
        )
        self.fast_forward = fast_forward
        self.token_events = token_events
        self.scheduler = Scheduler(self.profile)
        self.now = 0.0
        self._seqs: dict[str, Sequence] = {}
        self._step: _InFlight | None = None
        self._pending: list[EngineEvent] = []
        self._steps = 0

    # ---- requests -------------------------------------------------------------------

    def validate(self, req: EngineRequest) -> None:
        if req.prompt_tokens < 1:
            raise ValueError("prompt_tokens must be >= 1")
        if req.output_tokens < 1:
            raise ValueError("output_tokens must be >= 1")
        total = req.prompt_tokens + req.output_tokens
        if total > self.profile.max_model_len:
            raise ValueError(
                f"prompt_tokens + output_tokens = {total} exceeds max_model_len "
                f"{self.profile.max_model_len}"
            )

    def add_request(self, req: EngineRequest, now: float) -> None:
        """Queue a request arriving at ``now`` (steps ending before ``now`` run first)."""
        self.validate(req)
        if req.request_id in self._seqs:
            raise ValueError(f"duplicate request_id {req.request_id!r}")
        earlier = self.advance_to(now)  # (evaluated before reading self._pending)
        self._pending.extend(earlier)
        seq = Sequence(req=req, arrival=max(now, self.now))
        self._seqs[req.request_id] = seq
        self.scheduler.waiting.append(seq)
        self._cut_decode_run()
        self._start_step_if_idle(self._pending)

    def abort(self, request_id: str, now: float | None = None) -> bool:
        """Drop a request and free its blocks (after running the steps that end by
        ``now``, whose events the next ``advance_to`` returns)."""
        if now is not None:
            earlier = self.advance_to(now)
            self._pending.extend(earlier)
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return False
        sched = self.scheduler
        if seq in sched.running:
            sched.running.remove(seq)
        else:
            with contextlib.suppress(ValueError):
                sched.waiting.remove(seq)
        sched.remove(seq)
        sched.counters.aborted += 1
        self._cut_decode_run()
        return True

    # ---- time -----------------------------------------------------------------------

    def next_event_time(self) -> float | None:
        """When the step (or decode run) in flight ends; None when idle."""
        return self._step.end if self._step else None

    def next_step_time(self) -> float | None:
        """When the next single step ends (for streaming token by token)."""
        return self._step.first_end if self._step else None

    def advance_to(self, t: float) -> list[EngineEvent]:
        events = self._pending
        self._pending = []
        while self._step is not None:
            st = self._step
            if st.end <= t + _EPS:
                self._step = None
                self.now = max(self.now, st.end)
                self._complete(st, st.steps, events)
                self._start_step_if_idle(events)
                continue
            if st.steps > 1 and st.first_end <= t + _EPS:
                done, done_at = self._decode_steps_done_by(st, t)
                self._complete(st, done, events, done_at)
                self._restart_run(st, done, done_at)
            break
        if t > self.now:
            self.now = t
        if self._pending:
            events.extend(self._pending)
            self._pending = []
        return events

    def _decode_steps_done_by(self, st: _InFlight, t: float) -> tuple[int, float]:
        """Steps of the run finished by ``t`` (at least 1, fewer than all) and the time
        the last of them ended."""
        lo, hi = 1, st.steps - 1  # first_end <= t < end
        lo_end = -1.0
        rt = self.profile.decode_run_time
        # Narrow the search with a guess from the run's mean step time: the answer is the
        # largest k with start + rt(k) <= t + eps (rt increases with k), so bracketing it
        # by two evaluations around the guess gives the same k as the plain search.
        guess = int((t - st.start) * st.steps / (st.end - st.start))
        if lo < guess < hi:
            g_end = st.start + rt(st.batch, st.kv0, guess)
            if g_end <= t + _EPS:
                lo, lo_end = guess, g_end
                if st.start + rt(st.batch, st.kv0, guess + 1) > t + _EPS:
                    hi = guess
            else:
                hi = guess - 1
                if lo < hi:
                    p_end = st.start + rt(st.batch, st.kv0, hi)
                    if p_end <= t + _EPS:
                        lo, lo_end = hi, p_end
        while lo < hi:
            mid = (lo + hi + 1) // 2
            mid_end = st.start + rt(st.batch, st.kv0, mid)
            if mid_end <= t + _EPS:
                lo, lo_end = mid, mid_end
            else:
                hi = mid - 1
        if lo_end < 0.0:
            lo_end = st.start + rt(st.batch, st.kv0, lo)
        return lo, lo_end

    def _restart_run(self, st: _InFlight, done: int, done_at: float) -> None:
        rt = self.profile.decode_run_time
        st.start = done_at
        st.kv0 += done * st.batch
        st.steps -= done
        st.first_end = st.start + rt(st.batch, st.kv0, 1)
        st.end = st.start + rt(st.batch, st.kv0, st.steps)
        self.now = max(self.now, st.start)
        # The first step of the remaining run needs its block now, as in a fresh step.
        kv = self.scheduler.kv
        for seq, _ in st.plan.scheduled:
            if not seq.done:
                kv.allocate(seq.request_id, seq.num_computed + 1)

    def _cut_decode_run(self) -> None:
        """Composition changes at the next step boundary: end the run at the step in progress."""
        st = self._step
        if st is not None and st.steps > 1:
            st.steps = 1
            st.end = st.first_end

    def _start_step_if_idle(self, events: list[EngineEvent]) -> None:
        if self._step is not None or not self.scheduler.has_work():
            return
        sched = self.scheduler
        plan = sched.schedule()
        start = self.now
        for seq in plan.preempted:
            events.append(EngineEvent(EventKind.PREEMPTED, seq.request_id, start))
        if not plan.scheduled:
            return
        prof = self.profile
        first = prof.step_time(plan.num_tokens, plan.num_seqs, plan.kv_tokens)
        steps = 1
        end = start + first
        if plan.pure_decode and self.fast_forward:
            remaining = min([s.output_limit - s.num_output for s, _ in plan.scheduled])
            if remaining > 1:
                steps = sched.decode_steps_possible(remaining)
                end = start + prof.decode_run_time(plan.num_seqs, plan.kv_tokens, steps)
        self._step = _InFlight(
            plan=plan,
            start=start,
            steps=steps,
            end=end,
            first_end=start + first,
            batch=plan.num_seqs,
            kv0=plan.kv_tokens,
        )

    def _complete(
        self, st: _InFlight, steps: int, events: list[EngineEvent], t_end: float | None = None
    ) -> None:
        """Apply ``steps`` steps of the plan; emit events at the time the last one ends
        (``t_end``, computed here when not given)."""
        self._steps += steps
        sched = self.scheduler
        counters = sched.counters
        kv = sched.kv
        if t_end is None:
            if steps == st.steps:
                t_end = st.end
            else:
                t_end = st.start + self.profile.decode_run_time(st.batch, st.kv0, steps)
        if steps > 1:
            self._allocate_decode_run_blocks(st, steps)
        finished = False
        token_events = self.token_events
        generated = 0
        for seq, new in st.plan.scheduled:
            if seq.done:
                continue  # aborted
            if (
                steps == 1
                and new == 1
                and seq.num_output
                and seq.num_computed + 1 == seq.num_tokens
            ):
                # Plain decode step (the hot path).
                seq.num_computed += 1
                seq.num_output += 1
                seq.num_tokens += 1
                generated += 1
                if token_events:
                    events.append(EngineEvent(EventKind.TOKENS, seq.request_id, t_end, count=1))
                if seq.num_output >= seq.output_limit:
                    self._finish(seq, t_end, events)
                    finished = True
                continue
            seq.num_computed += new if steps == 1 else steps
            if seq.num_hashed_blocks < len(seq.req.block_hashes):
                seq.num_hashed_blocks = kv.cache_full_blocks(
                    seq.request_id,
                    seq.req.block_hashes,
                    seq.num_computed,
                    seq.num_hashed_blocks,
                    seq.req.token_ids,
                )
            if seq.num_computed < seq.num_tokens:
                continue  # prefill chunk, no token sampled yet
            produced = steps
            if seq.num_output == 0:
                seq.first_token_time = t_end
                counters.prompt_tokens += seq.req.prompt_tokens
                events.append(
                    EngineEvent(
                        EventKind.FIRST_TOKEN,
                        seq.request_id,
                        t_end,
                        count=1,
                        cached_tokens=seq.cached_tokens,
                    )
                )
                seq.num_output = 1
                seq.num_tokens += 1
                produced -= 1
            if produced:
                seq.num_output += produced
                seq.num_tokens += produced
                if token_events:
                    events.append(
                        EngineEvent(EventKind.TOKENS, seq.request_id, t_end, count=produced)
                    )
            generated += steps
            if seq.num_output >= seq.output_limit:
                self._finish(seq, t_end, events)
                finished = True
        counters.generation_tokens += generated
        if finished:
            sched.running = [s for s in sched.running if not s.done]

    def _finish(self, seq: Sequence, t_end: float, events: list[EngineEvent]) -> None:
        events.append(EngineEvent(EventKind.FINISHED, seq.request_id, t_end, count=seq.num_output))
        self.scheduler.remove(seq)
        self._seqs.pop(seq.request_id, None)
        self.scheduler.counters.finished += 1

    def _allocate_decode_run_blocks(self, st: _InFlight, steps: int) -> None:
        """Allocate the blocks of steps 2..steps in the order single steps would."""
        bs = self.profile.block_size
        kv = self.scheduler.kv
        tables = kv.tables
        # Each sequence needs a block at steps j0, j0 + bs, ... (j0 in 2..bs+1). Single
        # steps allocate in (step, batch position) order, which is round by round (every
        # bs steps), each round in (j0, batch position) order.
        starts: list[tuple[int, int, Sequence]] = []
        one_each = True  # every need is one new block (the table ends where step j starts)
        total = 0
        for idx, (seq, _) in enumerate(st.plan.scheduled):
            if seq.done:
                continue
            c = seq.num_computed
            # Step j computes token c+j-1 and needs a new block when it starts one.
            j = 2 + (-(c + 1)) % bs
            if j <= steps:
                if len(tables[seq.request_id]) * bs != c + j - 1:
                    one_each = False
                starts.append((j, idx, seq))
                total += (steps - j) // bs + 1
        if not starts:
            return
        starts.sort()  # (j0, idx) pairs are unique
        pool = kv.pool
        if one_each and total <= pool.num_free:
            # One pool allocation hands out the same blocks, in the same order, as the
            # step-by-step allocations below. The counts differ by at most one (j0 spans
            # fewer than bs values): every sequence takes one block per full round, and
            # the last, partial round goes to a prefix of ``starts`` (the smallest j0).
            blocks = pool.allocate(total)
            m = len(starts)
            full = (steps - starts[-1][0]) // bs + 1  # rounds every sequence takes part in
            end = full * m
            for p, (_, _, seq) in enumerate(starts):
                tables[seq.request_id].extend(blocks[p:end:m])
            for p in range(total - end):
                tables[starts[p][2].request_id].append(blocks[end + p])
            return
        needs = [
            (j + r * bs, idx, seq) for j, idx, seq in starts for r in range((steps - j) // bs + 1)
        ]
        needs.sort()
        for j, _, seq in needs:
            kv.allocate(seq.request_id, seq.num_computed + j)

    # ---- cache and stats ------------------------------------------------------------

    def cached_prefix_tokens(self, block_hashes: Seq[int]) -> int:
        """Leading prompt tokens cached right now (no side effects)."""
        return len(self.scheduler.kv.pool.lookup(block_hashes)) * self.profile.block_size

    def reset_prefix_cache(self) -> bool:
        """Drop every cached block no request is using (like vLLM's /reset_prefix_cache)."""
        self.scheduler.kv.pool.reset_prefix_cache()
        return True

    def stats(self) -> EngineStats:
        sched = self.scheduler
        c = sched.counters
        pool = sched.kv.pool
        return EngineStats(
            running=len(sched.running),
            waiting=len(sched.waiting),
            kv_usage=pool.usage(),
            num_gpu_blocks=pool.num_blocks,
            num_free_blocks=pool.num_free,
            prefix_cache_queries=c.prefix_queries,
            prefix_cache_hits=c.prefix_hits,
            preemptions=c.preemptions,
            prompt_tokens=c.prompt_tokens,
            generation_tokens=c.generation_tokens,
            finished=c.finished,
            aborted=c.aborted,
            steps=self._steps,
        )
