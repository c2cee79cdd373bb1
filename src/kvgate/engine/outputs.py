"""Deterministic output text and the output-length rule.

The same request (prompt text + sampling fields) always produces the same output, so
benchmarks and tests are reproducible. Rule:

* ``ignore_eos``: exactly ``max_tokens`` tokens (finish_reason "length");
* otherwise a natural length 16..255 derived from a hash of the prompt ("end of
  sequence"), raised to ``min_tokens`` and capped at ``max_tokens`` ("length" when
  capped, else "stop");
* ``stop`` strings end the output at their first occurrence after ``min_tokens``
  tokens; the stop string itself is not returned (finish_reason "stop").
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import xxhash

_WORDS = tuple(
    [
        "the",
        "a",
        "of",
        "and",
        "to",
        "in",
        "is",
        "that",
        "it",
        "for",
        "on",
        "with",
        "as",
        "this",
        "be",
        "by",
        "are",
        "from",
        "at",
        "or",
        "an",
        "can",
        "cache",
        "model",
        "token",
        "engine",
        "block",
        "prefix",
        "batch",
        "queue",
        "route",
        "node",
        "answer",
        "result",
        "value",
        "system",
        "request",
        "stream",
        "memory",
        "latency",
        "quota",
        "tenant",
        "data",
        "index",
        "table",
        "report",
        "window",
    ]
)
NATURAL_MIN = 16
NATURAL_SPAN = 240


@dataclass(frozen=True, slots=True)
class OutputPlan:
    pieces: list[str]  # one string per output token
    text: str  # returned text (stop string removed)
    finish_reason: str  # "stop" | "length"

    @property
    def num_tokens(self) -> int:
        return len(self.pieces)


def output_seed(prompt_text: str) -> int:
    return xxhash.xxh3_64_intdigest(prompt_text.encode())


def natural_length(seed: int) -> int:
    return NATURAL_MIN + seed % NATURAL_SPAN


def output_pieces(seed: int, n: int) -> list[str]:
    """``n`` token pieces: words, with a full stop every few words and line breaks."""
    rng = random.Random(seed)
    pieces: list[str] = []
    since_stop = 0
    sentence_len = rng.randint(6, 14)
    while len(pieces) < n:
        if since_stop >= sentence_len:
            pieces.append(".")
            if len(pieces) < n and rng.random() < 0.25:
                pieces.append("\n")
            since_stop = 0
            sentence_len = rng.randint(6, 14)
            continue
        pieces.append(" " + rng.choice(_WORDS))
        since_stop += 1
    return pieces[:n]


def plan_output(
    prompt_text: str,
    *,
    max_tokens: int,
    min_tokens: int = 0,
    ignore_eos: bool = False,
    stop: Sequence[str] = (),
) -> OutputPlan:
    seed = output_seed(prompt_text)
    if ignore_eos:
        n, reason = max_tokens, "length"
    else:
        n = max(min_tokens, natural_length(seed))
        reason = "stop"
        if n >= max_tokens:
            n, reason = max_tokens, "length"
    pieces = output_pieces(seed, n)
    text = "".join(pieces)
    if stop:
        guarded = len("".join(pieces[:min_tokens]))
        found: tuple[int, int] | None = None  # (position, end) of the earliest stop string
        for s in stop:
            pos = text.find(s, guarded) if s else -1
            if pos >= 0 and (found is None or pos < found[0]):
                found = (pos, pos + len(s))
        if found is not None:
            # Tokens generated up to and including the one that completes the stop string.
            count, length = 0, 0
            while length < found[1]:
                length += len(pieces[count])
                count += 1
            return OutputPlan(pieces[:count], text[: found[0]], "stop")
    return OutputPlan(pieces, text, reason)
