import random
import types

import pytest

from kvgate.clock import ManualClock, WouldSuspend, run_now
from kvgate.prompts import PromptError, render_chat, stable_prefix
from kvgate.tokens import BLOCK_SIZE, block_hashes, count_tokens, synthetic_text, tokenize


def test_tokenize_round_trips_and_is_deterministic() -> None:
    text = "Hello, world!  The year 2026 brought internationalization.\n\tEnd"
    pieces = tokenize(text)
    assert "".join(pieces) == text
    assert pieces == tokenize(text)
    assert count_tokens(text) == len(pieces)


def test_synthetic_text_has_exact_token_count() -> None:
    rng = random.Random(7)
    for n in (0, 1, 15, 16, 17, 2048):
        assert count_tokens(synthetic_text(n, rng)) == n


def test_block_hashes_are_chained() -> None:
    rng = random.Random(1)
    a = tokenize(synthetic_text(64, rng))
    b = list(a)
    b[3] = " different"
    ha, hb = block_hashes(a), block_hashes(b)
    assert len(ha) == 64 // BLOCK_SIZE
    # a change in block 0 changes every later hash, although blocks 1.. are identical
    assert all(x != y for x, y in zip(ha, hb, strict=True))
    assert block_hashes(a[:40]) == ha[:2]  # partial last block has no hash


def test_render_chat_and_stable_prefix() -> None:
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    tools = [{"type": "function", "function": {"name": "f"}}]
    text = render_chat(msgs, tools)
    assert text.startswith(stable_prefix(msgs, tools))
    assert text.endswith("<|assistant|>\n")
    with pytest.raises(PromptError, match="messages"):
        render_chat([])
    with pytest.raises(PromptError, match=r"messages\[0\].role"):
        render_chat([{"role": "bogus", "content": "x"}])


def test_manual_clock_and_run_now() -> None:
    clock = ManualClock()
    clock.advance(1.5)
    assert clock.now() == 1.5
    with pytest.raises(ValueError):
        clock.advance(-1)

    async def immediate() -> int:
        return 3

    assert run_now(immediate()) == 3

    @types.coroutine
    def yield_once():  # type: ignore[no-untyped-def]
        yield None

    async def suspends() -> None:
        await yield_once()

    with pytest.raises(WouldSuspend):
        run_now(suspends())


def test_head_cache_gives_the_plain_hashes() -> None:
    import random

    from kvgate.tokens import synthetic_text, text_block_hashes, text_block_hashes_with_head

    rng = random.Random(3)
    system = "<|system|>\n" + synthetic_text(203, rng) + "\n"
    for rest in ("<|user|>\nhi there\n<|assistant|>\n", " space first", "\nnewline", "x1 2 3"):
        text = system + rest
        for _ in range(2):  # cold, then from the cache
            assert text_block_hashes_with_head(text, len(system)) == text_block_hashes(text)
    odd = "<|system|>\nends mid word"
    assert text_block_hashes_with_head(odd + "more", len(odd)) == text_block_hashes(odd + "more")
