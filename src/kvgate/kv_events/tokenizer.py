"""A request → the engine's prompt token ids and block hashes, through the model's tokenizer.

Both the gateway (to query the precise index) and engine-sim (to key its cache) hash with a
``PromptHasher``. ``engine_tokens(endpoint, body)`` renders the request as its engine does
(``kvgate.kv_events.render``: the model's chat template next to ``tokenizer.json`` with
vLLM's special-token rules, or kvgate's canonical template when the model directory has
none) and tokenizes it; ``hash_ids`` cuts the ids into blocks of the engine's block size.
``hash_text`` is the plain-text path engine-sim uses (special tokens added).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from kvgate.kv_events.hashing import TokenBlockHasher
from kvgate.kv_events.render import EnginePrompt, PromptRenderer


@dataclass(slots=True)
class EngineHashes:
    """A request's prompt as its engines see it: token count and, per KV block size, the
    chained 64-bit block hashes the engines' events carry."""

    prompt_tokens: int
    by_block_size: dict[int, list[int]] = field(default_factory=dict)


class PromptHasher:
    def __init__(
        self,
        tokenizer_path: str | Path,
        *,
        block_size: int = 16,
        algo: str = "sha256_cbor",
        seed: str = "0",
        renderer: PromptRenderer | None = None,
    ) -> None:
        try:
            self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        except Exception as exc:  # the tokenizers library raises plain Exceptions
            raise ValueError(f"cannot load tokenizer {tokenizer_path}: {exc}") from None
        self.path = str(tokenizer_path)
        self.algo = algo
        self.seed = seed
        self.hasher = TokenBlockHasher(block_size, algo, seed)
        self._hashers = {block_size: self.hasher}
        try:
            self.renderer = renderer or PromptRenderer.for_tokenizer(tokenizer_path)
        except ValueError as exc:
            raise ValueError(f"{tokenizer_path}: {exc}") from None

    @property
    def block_size(self) -> int:
        return self.hasher.block_size

    def hasher_for(self, block_size: int) -> TokenBlockHasher:
        hasher = self._hashers.get(block_size)
        if hasher is None:
            hasher = self._hashers[block_size] = TokenBlockHasher(block_size, self.algo, self.seed)
        return hasher

    def encode(self, prompt: EnginePrompt) -> list[int]:
        ids = self.tokenizer.encode(prompt.text, add_special_tokens=prompt.add_special_tokens).ids
        return list(ids)

    def token_ids(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=True).ids)

    def engine_tokens(self, endpoint: str, body: Mapping[str, Any]) -> list[int]:
        """The prompt token ids the engine computes for a request body; ``NotRenderable`` or
        ``PromptError`` when it cannot be reproduced or the body is malformed."""
        return self.encode(self.renderer.render(endpoint, body))

    def hash_ids(self, ids: list[int], block_sizes: Iterable[int]) -> EngineHashes:
        out = EngineHashes(len(ids))
        for bs in block_sizes:
            out.by_block_size[bs] = self.hasher_for(bs).hashes(ids)
        return out

    def hash_text(self, text: str) -> tuple[int, list[int]]:
        """(prompt tokens, the engine's 64-bit block hashes) of a rendered prompt."""
        ids = self.token_ids(text)
        return len(ids), self.hasher.hashes(ids)
