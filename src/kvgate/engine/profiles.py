"""Hardware/model profiles and the roofline step-time model.

One engine step processes ``num_tokens`` scheduled tokens for ``num_seqs`` sequences whose
attention reads ``kv_tokens`` cached tokens. Its duration is

    overhead + per_seq * num_seqs
      + max(2 * params * num_tokens / (peak_flops * mfu),
            (weight_bytes + kv_tokens * kv_bytes_per_token) / (mem_bw * bw_eff))

The derivation of every number is in docs/engine-model.md.

A profile may replace the roofline with measured speeds, as a test of another engine
would state them: ``decode_s_per_token`` makes a step of ``b`` sequences cost
``decode_s_per_token * (1 + DECODE_BATCH_SLOWDOWN * (b - 1))`` and
``prefill_tokens_per_s`` makes its prompt tokens cost ``1 / prefill_tokens_per_s`` each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from kvgate.tokens import BLOCK_SIZE

GIB = 1024**3
# relative slowdown of a decode step per extra running sequence, with a decode override
DECODE_BATCH_SLOWDOWN = 0.005


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    model: str  # default served model name
    param_count: float
    weight_bytes: float
    kv_bytes_per_token: int
    peak_flops: float  # FLOP/s, dense BF16, all devices of the replica
    mfu: float  # achievable fraction of peak on the matmuls
    mem_bw: float  # bytes/s, all devices of the replica
    bw_eff: float  # achievable fraction of peak bandwidth
    overhead_s: float  # fixed per-step cost (launch, scheduling, all-reduce latency)
    per_seq_s: float  # per-sequence cost per step (sampling, bookkeeping)
    num_gpu_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int = BLOCK_SIZE
    decode_s_per_token: float | None = None  # replaces the roofline's decode step
    prefill_tokens_per_s: float | None = None  # replaces the roofline's prompt compute

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    @property
    def seconds_per_compute_token(self) -> float:
        return 2.0 * self.param_count / (self.peak_flops * self.mfu)

    @property
    def seconds_per_byte(self) -> float:
        return 1.0 / (self.mem_bw * self.bw_eff)

    def step_time(self, num_tokens: int, num_seqs: int, kv_tokens: int) -> float:
        """Duration of one step (seconds of simulated time)."""
        if self.decode_s_per_token is not None:
            return self._decode_step(num_seqs) + self._prompt_time(num_tokens - num_seqs)
        compute = num_tokens * self.seconds_per_compute_token
        if self.prefill_tokens_per_s is not None:
            # one decode token per scheduled sequence; the rest are prompt tokens
            compute = num_seqs * self.seconds_per_compute_token
            prompt = self._prompt_time(num_tokens - num_seqs)
        else:
            prompt = 0.0
        memory = (self.weight_bytes + kv_tokens * self.kv_bytes_per_token) * self.seconds_per_byte
        return self.overhead_s + self.per_seq_s * num_seqs + max(compute, memory) + prompt

    def decode_run_time(self, batch: int, kv_tokens: int, steps: int) -> float:
        """Total time of ``steps`` consecutive pure-decode steps of ``batch`` sequences.

        Step j reads ``kv_tokens + j * batch`` cached tokens, so the memory term grows
        linearly; the sum is computed in closed form (no loop over steps).
        """
        if steps <= 0:
            return 0.0
        if self.decode_s_per_token is not None:
            return steps * self._decode_step(batch)
        fixed = self.overhead_s + self.per_seq_s * batch
        compute = batch * self.seconds_per_compute_token
        mem0 = (self.weight_bytes + kv_tokens * self.kv_bytes_per_token) * self.seconds_per_byte
        slope = batch * self.kv_bytes_per_token * self.seconds_per_byte
        if slope <= 0.0:
            return steps * (fixed + max(compute, mem0))
        # First step index at which memory dominates compute.
        switch = min(steps, max(0, math.ceil((compute - mem0) / slope)))
        mem_steps = steps - switch
        # sum_{j=switch}^{steps-1} (mem0 + j*slope)
        index_sum = (steps - 1) * steps / 2 - (switch - 1) * switch / 2
        return steps * fixed + switch * compute + mem_steps * mem0 + slope * index_sum

    def _decode_step(self, batch: int) -> float:
        assert self.decode_s_per_token is not None
        return self.decode_s_per_token * (1.0 + DECODE_BATCH_SLOWDOWN * max(0, batch - 1))

    def _prompt_time(self, prompt_tokens: int) -> float:
        """Compute time of a step's prompt tokens (each sequence also decodes one)."""
        prompt_tokens = max(0, prompt_tokens)
        if self.prefill_tokens_per_s is not None:
            return prompt_tokens / self.prefill_tokens_per_s
        return prompt_tokens * self.seconds_per_compute_token

    def with_overrides(
        self,
        *,
        kv_blocks: int | None = None,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        max_model_len: int | None = None,
        model: str | None = None,
        decode_ms_per_token: float | None = None,
        prefill_tokens_per_s: float | None = None,
    ) -> Profile:
        p = replace(
            self,
            num_gpu_blocks=kv_blocks if kv_blocks is not None else self.num_gpu_blocks,
            max_num_seqs=max_num_seqs if max_num_seqs is not None else self.max_num_seqs,
            max_num_batched_tokens=(
                max_num_batched_tokens
                if max_num_batched_tokens is not None
                else self.max_num_batched_tokens
            ),
            max_model_len=max_model_len if max_model_len is not None else self.max_model_len,
            model=model if model is not None else self.model,
            decode_s_per_token=(
                decode_ms_per_token / 1000.0
                if decode_ms_per_token is not None
                else self.decode_s_per_token
            ),
            prefill_tokens_per_s=(
                prefill_tokens_per_s
                if prefill_tokens_per_s is not None
                else self.prefill_tokens_per_s
            ),
        )
        if p.decode_s_per_token is not None and not p.decode_s_per_token > 0:
            raise ValueError("decode_ms_per_token must be > 0")
        if p.prefill_tokens_per_s is not None and not p.prefill_tokens_per_s > 0:
            raise ValueError("prefill_tokens_per_s must be > 0")
        for field_name in ("num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(p, field_name) < 1:
                raise ValueError(f"{field_name} must be >= 1")
        if p.max_model_len < 2:
            raise ValueError("max_model_len must be >= 2")
        # Like vLLM, a request must fit in the KV cache on its own; clamp the context.
        return replace(p, max_model_len=min(p.max_model_len, p.kv_capacity_tokens))


def _usable_kv_blocks(
    total_hbm_bytes: float,
    utilization: float,
    weight_bytes: float,
    reserve_bytes: float,
    kv_per_token: int,
) -> int:
    usable = total_hbm_bytes * utilization - weight_bytes - reserve_bytes
    return int(usable // (kv_per_token * BLOCK_SIZE))


H100_BF16_FLOPS = 989.4e12  # dense BF16, SXM5
H100_HBM_BW = 3.35e12  # bytes/s, HBM3
H100_HBM_BYTES = 80 * GIB

LLAMA3_8B_PARAMS = 8.03e9
LLAMA3_8B_KV = 2 * 32 * 8 * 128 * 2  # K+V * layers * kv heads * head dim * BF16 = 128 KiB
LLAMA3_70B_PARAMS = 70.6e9
LLAMA3_70B_KV = 2 * 80 * 8 * 128 * 2  # 320 KiB
GEMMA3_270M_PARAMS = 268e6
GEMMA3_270M_KV = 2 * 18 * 1 * 256 * 2  # 18 KiB

_gemma_weights = GEMMA3_270M_PARAMS * 2


def _bf16_on_h100(
    name: str,
    model: str,
    params: float,
    kv_per_token: int,
    *,
    gpus: int,
    mfu: float,
    bw_eff: float,
    overhead_s: float,
) -> Profile:
    """A BF16 model on ``gpus`` H100s (tensor parallel): KV gets 0.9 of HBM (vLLM's
    ``gpu_memory_utilization``) less the weights and 4 GiB per GPU of activations/CUDA
    graphs (docs/engine-model.md)."""
    weights = params * 2
    return Profile(
        name=name,
        model=model,
        param_count=params,
        weight_bytes=weights,
        kv_bytes_per_token=kv_per_token,
        peak_flops=gpus * H100_BF16_FLOPS,
        mfu=mfu,
        mem_bw=gpus * H100_HBM_BW,
        bw_eff=bw_eff,
        overhead_s=overhead_s,
        per_seq_s=0.0,
        num_gpu_blocks=_usable_kv_blocks(
            gpus * H100_HBM_BYTES, 0.9, weights, gpus * 4 * GIB, kv_per_token
        ),
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        max_model_len=131072,
    )


PROFILES: dict[str, Profile] = {
    profile.name: profile
    for profile in (
        _bf16_on_h100(
            "llama3-8b-h100",
            "meta-llama/Llama-3.1-8B-Instruct",
            LLAMA3_8B_PARAMS,
            LLAMA3_8B_KV,
            gpus=1,
            mfu=0.5,
            bw_eff=0.8,
            overhead_s=1.0e-3,
        ),
        _bf16_on_h100(
            "llama3-70b-h100-tp4",
            "meta-llama/Llama-3.1-70B-Instruct",
            LLAMA3_70B_PARAMS,
            LLAMA3_70B_KV,
            gpus=4,
            mfu=0.4,
            bw_eff=0.7,
            overhead_s=3.0e-3,
        ),
        # Calibrated to llama.cpp on a 2-core x86_64 VM, 1 thread: prefill 3.125 ms/token,
        # decode 24.4 ms (weights read) + 14.1 ms per sequence per step.
        Profile(
            name="gemma3-270m-cpu",
            model="google/gemma-3-270m-it",
            param_count=GEMMA3_270M_PARAMS,
            weight_bytes=_gemma_weights,
            kv_bytes_per_token=GEMMA3_270M_KV,
            peak_flops=2 * GEMMA3_270M_PARAMS / 3.125e-3,
            mfu=1.0,
            mem_bw=_gemma_weights / 24.4e-3,
            bw_eff=1.0,
            overhead_s=0.0,
            per_seq_s=14.1e-3,
            num_gpu_blocks=2048,
            max_num_seqs=8,
            max_num_batched_tokens=2048,
            max_model_len=8192,
        ),
    )
}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"profile: unknown name {name!r}; known: {', '.join(PROFILES)}") from None
