"""A decode run's blocks are handed out as single steps would hand them out."""

from __future__ import annotations

import copy
import random

import pytest

from kvgate.engine.core import EngineCore, _InFlight
from kvgate.engine.profiles import get_profile
from kvgate.engine.request import EngineRequest, Sequence
from kvgate.engine.scheduler import StepPlan


def _step_by_step(core: EngineCore, st: _InFlight, steps: int) -> None:
    """Steps 2..steps one at a time: each sequence that starts a block at step j takes it
    then, in batch order."""
    bs = core.profile.block_size
    kv = core.scheduler.kv
    for j in range(2, steps + 1):
        for seq, _ in st.plan.scheduled:
            if not seq.done and (seq.num_computed + j - 1) % bs == 0:
                kv.allocate(seq.request_id, seq.num_computed + j)


@pytest.mark.parametrize("seed", range(40))
def test_decode_run_blocks_match_single_steps(seed: int) -> None:
    rng = random.Random(seed)
    core = EngineCore(get_profile("gemma3-270m-cpu"), kv_blocks=rng.choice([60, 200]))
    bs = core.profile.block_size
    kv = core.scheduler.kv
    plan = StepPlan()
    for i in range(rng.randint(1, 7)):
        computed = rng.randint(1, 6 * bs)
        req = EngineRequest(f"r{i}", computed, [], 400)
        seq = Sequence(req=req, arrival=0.0, num_computed=computed, num_output=1)
        seq.done = rng.random() < 0.1
        # the table holds the blocks of the tokens computed so far and of the next one,
        # sometimes one more (allocated ahead): then the fast path does not apply
        kv.allocate(seq.request_id, computed + 1 + (bs if rng.random() < 0.15 else 0))
        plan.scheduled.append((seq, 1))
        if rng.random() < 0.3:
            kv.free(f"r{i}")  # blocks freed and reused: the free queue has an order
            kv.allocate(seq.request_id, computed + 1)
    steps = rng.randint(2, 3 * bs + 3)
    st = _InFlight(plan=plan, start=0.0, steps=steps, end=1.0, first_end=0.1)
    expected = copy.deepcopy(core)
    _step_by_step(expected, copy.deepcopy(st), steps)
    ran = copy.deepcopy(core)
    ran_st = copy.deepcopy(st)
    try:
        ran._allocate_decode_run_blocks(ran_st, steps)
    except RuntimeError:  # out of blocks: the reference must run out too
        with pytest.raises(RuntimeError):
            _step_by_step(copy.deepcopy(core), copy.deepcopy(st), steps)
        return
    assert ran.scheduler.kv.tables == expected.scheduler.kv.tables
    assert ran.scheduler.kv.pool.eviction_order() == expected.scheduler.kv.pool.eviction_order()
