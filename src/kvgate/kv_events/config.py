"""Configuration of the KV-event path (validated at load; messages name the field)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kvgate.kv_events.hashing import HASH_ALGOS

DEFAULT_BLOCK_SIZE = 16
# Engines that publish vLLM's KV event stream (SGLang publishes the same shape).
EVENT_ENGINE_TYPES = ("vllm", "sglang", "sim")


class NodeEventsConfig(BaseModel):
    """Where one engine publishes (vLLM: ``--kv-events-config`` endpoint/replay/topic)."""

    model_config = ConfigDict(extra="forbid")

    endpoint: str  # e.g. tcp://10.0.0.5:5557 (the engine binds tcp://*:5557)
    replay_endpoint: str | None = None  # e.g. tcp://10.0.0.5:5558
    topic: str = ""
    # "engine": index the engine's own block hashes (vLLM, engine-sim: the gateway computes
    # the same ones). "tokens": re-hash each stored block's token ids (SGLang, whose hashes
    # the gateway cannot reproduce). Default: by engine type.
    hashes: Literal["engine", "tokens"] | None = None

    def hash_source(self, engine_type: str) -> str:
        if self.hashes is not None:
            return self.hashes
        return "tokens" if engine_type == "sglang" else "engine"

    @field_validator("endpoint", "replay_endpoint")
    @classmethod
    def _zmq(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("tcp://", "ipc://", "inproc://")):
            raise ValueError("must be a ZMQ endpoint (tcp://host:port, ipc://path)")
        return v


class KvEventsConfig(BaseModel):
    """How the gateway hashes prompts the way the engines do."""

    model_config = ConfigDict(extra="forbid")

    # model name → tokenizer.json; a model without one is hashed with kvgate's text model
    # (what engine-sim does without --tokenizer)
    tokenizers: dict[str, str] = {}
    hash_algo: str = "sha256_cbor"  # vLLM --prefix-caching-hash-algo
    hash_seed: str = "0"  # the engines' PYTHONHASHSEED
    # The engines' KV block size, as an explicit override for every node. Unset (the
    # default): each node's own, from its cache_config_info metric (vLLM) or, failing
    # that, from its BlockStored events; DEFAULT_BLOCK_SIZE until either is seen.
    block_size: int | None = Field(default=None, ge=1)
    replay_timeout_s: float = Field(default=2.0, gt=0)

    @field_validator("tokenizers")
    @classmethod
    def _tokenizer_files(cls, v: dict[str, str]) -> dict[str, str]:
        for model, path in v.items():
            if not Path(path).is_file():
                raise ValueError(f"{model}: tokenizer file {path} does not exist")
        return v

    @field_validator("hash_algo")
    @classmethod
    def _algo(cls, v: str) -> str:
        if v not in HASH_ALGOS:
            raise ValueError(
                f"must be one of {', '.join(HASH_ALGOS)} (reproducible across processes)"
            )
        return v
