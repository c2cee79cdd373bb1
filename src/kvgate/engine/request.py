"""Requests entering the engine model and the events it emits."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from kvgate.tokens import BLOCK_SIZE, block_hashes, tokenize


@dataclass(slots=True)
class EngineRequest:
    """A request as the engine sees it: token counts and prompt block hashes, no text.

    ``output_tokens`` is how many tokens the request will generate (the server decides
    it from max_tokens / stop / min_tokens before submitting).
    """

    request_id: str
    prompt_tokens: int
    block_hashes: list[int]
    output_tokens: int
    token_ids: list[int] | None = None  # the prompt's ids, when tokenized (cache events)

    @classmethod
    def from_text(
        cls, request_id: str, text: str, output_tokens: int, block_size: int = BLOCK_SIZE
    ) -> EngineRequest:
        pieces = tokenize(text)
        return cls(request_id, len(pieces), block_hashes(pieces, block_size), output_tokens)


class EventKind(StrEnum):
    FIRST_TOKEN = "first_token"  # prefill done, first output token sampled
    TOKENS = "tokens"  # ``count`` more output tokens, the last one at ``time``
    FINISHED = "finished"  # all ``count`` output tokens generated; blocks freed
    PREEMPTED = "preempted"  # blocks freed, back to the front of the waiting queue
    FAILED = "failed"  # the server's driver failed; the request cannot finish


@dataclass(slots=True, frozen=True)
class EngineEvent:
    kind: EventKind
    request_id: str
    time: float
    count: int = 0
    cached_tokens: int = 0


@dataclass(slots=True)
class Sequence:
    """Scheduler-side state of one request."""

    req: EngineRequest
    arrival: float
    num_computed: int = 0  # tokens whose KV is in the cache
    num_output: int = 0  # output tokens sampled so far
    num_hashed_blocks: int = 0
    cached_tokens: int = -1  # prefix-cache hit at first scheduling; -1 = never scheduled
    num_preemptions: int = 0
    done: bool = False  # finished or aborted
    first_token_time: float | None = None
    # prompt + output tokens so far; a plain field because the scheduler reads it per step
    num_tokens: int = 0
    output_limit: int = 0
    request_id: str = ""

    def __post_init__(self) -> None:
        self.num_tokens = self.req.prompt_tokens + self.num_output
        self.output_limit = self.req.output_tokens
        self.request_id = self.req.request_id
