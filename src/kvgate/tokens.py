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


_HEAD_CACHE: OrderedDict[str, tuple[int, list[int], list[str]]] = OrderedDict()
HEAD_CACHE_SIZE = 512


def text_block_hashes_with_head(
    text: str, head_len: int, block_size: int = BLOCK_SIZE
) -> tuple[int, list[int]]:
    """``text_block_hashes(text)``, reusing the work for ``text[:head_len]`` across calls.

    The head (a system prompt shared by many requests) is tokenized and hashed once and
    kept in an LRU. Exact only where no token crosses the cut: the head ends with a
    newline and the rest starts with a non-space character (then every token pattern
    stops at the cut); otherwise this is the plain computation.
    """
    if not 0 < head_len < len(text) or text[head_len - 1] != "\n" or text[head_len].isspace():
        return text_block_hashes(text, block_size)
    head = text[:head_len]
    cached = _HEAD_CACHE.get(head)
    if cached is None:
        pieces = tokenize(head)
        hashes = block_hashes(pieces, block_size)
        cached = (len(pieces), hashes, pieces[len(hashes) * block_size :])
        _HEAD_CACHE[head] = cached
        if len(_HEAD_CACHE) > HEAD_CACHE_SIZE:
            _HEAD_CACHE.popitem(last=False)
    else:
        _HEAD_CACHE.move_to_end(head)
    n_head, head_hashes, leftover = cached
    rest = tokenize(text[head_len:])
    parent = head_hashes[-1] if head_hashes else ROOT_HASH
    more = block_hashes(leftover + rest, block_size, parent)
    return n_head + len(rest), head_hashes + more


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
