"""The capacity a simulated engine profile should show, from its own parameters.

A closed-loop ramp of requests of ``context`` tokens (prompt + output) saturates the
simulated engine where the next request can no longer be scheduled at once:

* ``max_num_seqs`` running requests (the batch is full), or
* the KV cache is full: ``num_gpu_blocks`` blocks hold ``kv_blocks // blocks(context)``
  whole requests (each request's blocks are rounded up to the block size).

Past that point a new request waits in the engine queue for a finish (or preempts one),
so its TTFT jumps by a fraction of a whole request time: the knee. The runtime tokens
at the knee are the KV tokens those requests hold on average over time: each holds its
prompt and, averaged over its decode, half its output, so ``seqs × (prompt + output/2)``. The step-time model only shapes
how latency rises before the knee (docs/engine-model.md); it does not move it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvgate.engine.profiles import Profile


@dataclass(frozen=True, slots=True)
class AnalyticCapacity:
    concurrency: int
    runtime_tokens: int
    bound: str  # max_num_seqs | kv_cache


def analytic_capacity(profile: Profile, context: int, output_tokens: int) -> AnalyticCapacity:
    blocks_per_request = -(-context // profile.block_size)
    kv_seqs = profile.num_gpu_blocks // blocks_per_request
    seqs = min(profile.max_num_seqs, kv_seqs)
    bound = "max_num_seqs" if profile.max_num_seqs <= kv_seqs else "kv_cache"
    held = (context - output_tokens) + output_tokens / 2
    return AnalyticCapacity(seqs, round(seqs * held), bound)
