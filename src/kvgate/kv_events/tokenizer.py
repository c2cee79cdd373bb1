"""Prompt text → the engine's block hashes, through the model's tokenizer.

Both the gateway (to query the precise index) and engine-sim (to key its cache) hash a
prompt with a ``PromptHasher``, so configured with the same tokenizer.json, block size,
algorithm and seed, they produce the same hashes for the same rendered prompt. Special
tokens are added as the tokenizer's post-processor defines them (vLLM's default for a
completion prompt). Chat prompts are hashed as kvgate renders them (``kvgate.prompts``):
a real vLLM renders with the model's own chat template, so against vLLM the precise
signal is exact for /v1/completions and for chat only when the templates agree.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from kvgate.kv_events.hashing import TokenBlockHasher


class PromptHasher:
    def __init__(
        self,
        tokenizer_path: str | Path,
        *,
        block_size: int = 16,
        algo: str = "sha256_cbor",
        seed: str = "0",
    ) -> None:
        try:
            self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        except Exception as exc:  # the tokenizers library raises plain Exceptions
            raise ValueError(f"cannot load tokenizer {tokenizer_path}: {exc}") from None
        self.path = str(tokenizer_path)
        self.hasher = TokenBlockHasher(block_size, algo, seed)

    @property
    def block_size(self) -> int:
        return self.hasher.block_size

    def token_ids(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=True).ids)

    def hash_text(self, text: str) -> tuple[int, list[int]]:
        """(prompt tokens, the engine's 64-bit block hashes) of a rendered prompt."""
        ids = self.token_ids(text)
        return len(ids), self.hasher.hashes(ids)
