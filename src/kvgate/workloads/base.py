"""Work items and the tokenized-prompt cache the simulator uses."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from kvgate.prompts import render_chat_parts
from kvgate.routing.config import RouteKeyConfig
from kvgate.routing.route_key import route_key_for
from kvgate.tokens import BLOCK_SIZE, ROOT_HASH, block_hashes, tokenize


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


_KEY_CHARS = 64  # of a stable text's end, with its length, key the prompt cache


class PromptCache:
    """Tokenizes rendered prompts, reusing the work done for a shared leading part.

    The rendered chat text is ``stable_prefix`` + the rest, and the stable prefix ends in
    a newline followed by ``<|``, a boundary the tokenizer never merges across, so the
    pieces of the whole text are the stable part's pieces followed by the rest's.
    Identical stable prefixes (system prompt + tools) are tokenized and hashed once.
    """

    def __init__(self, max_entries: int = 4096) -> None:
        # (length, last characters) of a stable text → (the text, its token count, its
        # full blocks' hashes, the pieces after them). Each request renders its stable
        # text anew, and hashing a fresh 10 kB string per lookup costs more than comparing
        # it with the one text its short key finds (a key shared by two texts only makes
        # them take turns in the cache).
        self._prefixes: OrderedDict[tuple[int, str], tuple[str, int, list[int], list[str]]] = (
            OrderedDict()
        )
        self._max = max_entries

    def _prefix(self, text: str) -> tuple[int, list[int], list[str]]:
        key = (len(text), text[-_KEY_CHARS:])
        hit = self._prefixes.get(key)
        if hit is not None and hit[0] == text:
            self._prefixes.move_to_end(key)
            return hit[1], hit[2], hit[3]
        pieces = tokenize(text)
        hashes = block_hashes(pieces)
        # Only the last partial block's pieces are kept: a cache of whole piece lists
        # (thousands of small strings per prefix) grows the heap every later step walks.
        tail = pieces[len(hashes) * BLOCK_SIZE :]
        self._prefixes[key] = (text, len(pieces), hashes, tail)
        self._prefixes.move_to_end(key)
        if len(self._prefixes) > self._max:
            self._prefixes.popitem(last=False)
        return len(pieces), hashes, tail

    def prompt(self, item: WorkItem) -> TokenizedPrompt:
        stable, rest_text = render_chat_parts(item.messages)
        if not stable:
            pieces = tokenize(rest_text)
            return TokenizedPrompt(len(pieces), block_hashes(pieces))
        p_count, p_hashes, p_tail = self._prefix(stable)
        rest = tokenize(rest_text)
        parent = p_hashes[-1] if p_hashes else ROOT_HASH
        hashes = p_hashes + block_hashes(p_tail + rest, parent=parent)
        return TokenizedPrompt(p_count + len(rest), hashes)
