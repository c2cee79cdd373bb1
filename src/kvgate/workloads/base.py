"""Work items and the tokenized-prompt cache the simulator uses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvgate.prompts import render_chat_parts
from kvgate.routing.config import RouteKeyConfig
from kvgate.routing.route_key import route_key_for
from kvgate.tokens import HeadCache, block_hashes, tokenize


@dataclass(slots=True)
class WorkItem:
    request_id: str
    arrival: float  # seconds from the start of the run
    tenant: str
    messages: list[dict[str, Any]]
    max_tokens: int  # output length (ignore_eos)
    priority_class: str = "interactive"
    model: str = "default"
    group: str = ""  # prefix group / customer / conversation, for reports

    def chat_body(self) -> dict[str, Any]:
        """The OpenAI chat-completions body (stream fields are the client's business)."""
        return {
            "model": self.model,
            "messages": self.messages,
            "max_tokens": self.max_tokens,
            "ignore_eos": True,
        }

    def route_key(self, model: str, config: RouteKeyConfig) -> str:
        """The route key the gateway derives for ``chat_body()`` served by ``model``."""
        return route_key_for(model, self.messages, config=config)


@dataclass(slots=True)
class Workload:
    name: str
    seed: int
    params: dict[str, Any]
    items: list[WorkItem]
    tenants: dict[str, dict[str, Any]] = field(default_factory=dict)  # quota hints
    events: list[tuple[float, str, str]] = field(default_factory=list)  # (t, kind, node)

    @property
    def duration_s(self) -> float:
        return self.items[-1].arrival if self.items else 0.0


@dataclass(frozen=True, slots=True)
class TokenizedPrompt:
    prompt_tokens: int
    block_hashes: list[int]


class PromptCache:
    """Tokenizes rendered prompts, reusing the work done for a shared leading part.

    The rendered chat text is ``stable_prefix`` + the rest, and the stable prefix ends in
    a newline followed by ``<|``, a boundary the tokenizer never merges across, so the
    pieces of the whole text are the stable part's pieces followed by the rest's.
    Identical stable prefixes (system prompt + tools) are tokenized and hashed once (``HeadCache``, as the gateway does).
    """

    def __init__(self, max_entries: int = 4096) -> None:
        self._heads = HeadCache(max_entries)

    def prompt(self, item: WorkItem) -> TokenizedPrompt:
        stable, rest_text = render_chat_parts(item.messages)
        if not stable:
            pieces = tokenize(rest_text)
            return TokenizedPrompt(len(pieces), block_hashes(pieces))
        return TokenizedPrompt(*self._heads.hashes(stable, rest_text))
