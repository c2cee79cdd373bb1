"""The shared text model: an approximate tokenizer and chained block hashes.

The simulated engine, the gateway's estimates, the prefix index and the benchmarks all
count tokens with this module, so their numbers agree.

Tokenizer rule (deterministic, documented in docs/engine-model.md): text is split by the
regular expression ``TOKEN_PATTERN`` into pieces, in order:

* an optional leading space followed by 1-8 ASCII letters (longer words split into
  8-letter pieces, roughly like BPE sub-words);
* an optional leading space followed by 1-3 digits;
* an optional leading space followed by one other non-space character;
* a run of whitespace.

On English prose this gives about 4.5 characters per token, close to the Llama 3 and
GPT-4 tokenizers. Each piece is one token. ``synthetic_text`` produces text with an exact
token count for workloads.

Block hashes: the token pieces are cut into full blocks of ``BLOCK_SIZE`` (16) tokens;
block i's hash is xxh3_64 over (hash of block i-1, the block's pieces). A partial last
block has no hash (it is never cached), as in vLLM's automatic prefix caching.
"""

from __future__ import annotations

import random
import re
from collections import OrderedDict
from collections.abc import Sequence

import xxhash

BLOCK_SIZE = 16
TOKEN_PATTERN = re.compile(r" ?[A-Za-z]{1,8}| ?[0-9]{1,3}| ?[^\sA-Za-z0-9]|\s+")
ROOT_HASH = 0x6B76676174650000  # "kvgate" seed for the first block's parent
_SEP = "\x1f"

_xxh = xxhash.xxh3_64_intdigest


def tokenize(text: str) -> list[str]:
    """Split text into token pieces; ``"".join(tokenize(t)) == t``."""
    return TOKEN_PATTERN.findall(text)


def count_tokens(text: str) -> int:
    return len(TOKEN_PATTERN.findall(text))


def block_hashes(
    pieces: Sequence[str], block_size: int = BLOCK_SIZE, parent: int = ROOT_HASH
) -> list[int]:
    """Chained hashes of the full blocks of ``pieces``."""
    hashes: list[int] = []
    full = len(pieces) - len(pieces) % block_size
    h = parent
    for start in range(0, full, block_size):
        h = _xxh(h.to_bytes(8, "little") + _SEP.join(pieces[start : start + block_size]).encode())
        hashes.append(h)
    return hashes


def text_block_hashes(text: str, block_size: int = BLOCK_SIZE) -> tuple[int, list[int]]:
    """(token count, chained full-block hashes) of a prompt text."""
    pieces = tokenize(text)
    return len(pieces), block_hashes(pieces, block_size)


_KEY_CHARS = 64  # of a head's end: with its length, the head cache's key


class HeadCache:
    """Tokens and block hashes of shared heads (a system prompt many prompts start with),
    computed once per head: ``hashes(head, rest)`` is ``text_block_hashes(head + rest)``
    where no token crosses the cut (the caller's promise).

    An LRU keyed by the head's length and last characters, then compared with the text:
    each request renders its head anew, and hashing a fresh 10 kB string per lookup costs
    more than comparing it with the one text its short key finds (two heads sharing a key
    only take turns in the cache). Only the head's last partial block of pieces is kept,
    not all its pieces (thousands of small strings per head)."""

    def __init__(self, max_entries: int) -> None:
        self._heads: OrderedDict[tuple[int, str, int], tuple[str, int, list[int], list[str]]]
        self._heads = OrderedDict()
        self._max = max_entries

    def _head(self, head: str, block_size: int) -> tuple[int, list[int], list[str]]:
        key = (len(head), head[-_KEY_CHARS:], block_size)
        heads = self._heads
        hit = heads.get(key)
        if hit is not None and hit[0] == head:
            heads.move_to_end(key)
            return hit[1], hit[2], hit[3]
        pieces = tokenize(head)
        hashes = block_hashes(pieces, block_size)
        leftover = pieces[len(hashes) * block_size :]
        heads[key] = (head, len(pieces), hashes, leftover)
        heads.move_to_end(key)
        if len(heads) > self._max:
            heads.popitem(last=False)
        return len(pieces), hashes, leftover

    def hashes(self, head: str, rest: str, block_size: int = BLOCK_SIZE) -> tuple[int, list[int]]:
        """(token count, chained full-block hashes) of ``head + rest``."""
        n_head, head_hashes, leftover = self._head(head, block_size)
        more = tokenize(rest)
        parent = head_hashes[-1] if head_hashes else ROOT_HASH
        return n_head + len(more), head_hashes + block_hashes(leftover + more, block_size, parent)


HEAD_CACHE_SIZE = 512
_HEADS = HeadCache(HEAD_CACHE_SIZE)


def text_block_hashes_with_head(
    text: str, head_len: int, block_size: int = BLOCK_SIZE
) -> tuple[int, list[int]]:
    """``text_block_hashes(text)``, reusing the work for ``text[:head_len]`` across calls.

    The head (a system prompt shared by many requests) is tokenized and hashed once
    (``HeadCache``). Exact only where no token crosses the cut: the head ends with a
    newline and the rest starts with a non-space character (then every token pattern
    stops at the cut); otherwise this is the plain computation.
    """
    if not 0 < head_len < len(text) or text[head_len - 1] != "\n" or text[head_len].isspace():
        return text_block_hashes(text, block_size)
    return _HEADS.hashes(text[:head_len], text[head_len:], block_size)


_WORD_LIST = (
    "the of and to in is for on with as by at from that this it be are was or an will can "
    "data model cache token node route quota tenant request engine block prefix system user "
    "query answer policy cluster gateway latency memory queue batch stream server client "
    "value table index store report window share weight limit state event share price order "
    "customer product account invoice support ticket search result source chapter section"
)
_WORDS = tuple(_WORD_LIST.split())


def synthetic_text(n_tokens: int, rng: random.Random) -> str:
    """Text of exactly ``n_tokens`` tokens (each a space and a short word)."""
    if n_tokens <= 0:
        return ""
    words = rng.choices(_WORDS, k=n_tokens)
    return " " + " ".join(words)
