"""SSE splitting and usage parsing used by the streaming proxy."""

from __future__ import annotations

from kvgate.gateway.sse import SseSplitter
from kvgate.gateway.usage import (
    chunk_generated_tokens,
    client_wants_usage,
    is_usage_only_chunk,
    parse_usage,
    with_usage_requested,
)


def test_events_split_across_chunks() -> None:
    splitter = SseSplitter()
    assert list(splitter.feed(b'data: {"a"')) == []
    events = list(splitter.feed(b": 1}\n\ndata: [DONE]\r\n\r\n"))
    assert [e.data for e in events] == [b'{"a": 1}', b"[DONE]"]
    assert events[0].json() == {"a": 1}
    assert events[1].is_done
    assert splitter.pending == b""


def test_comment_events_have_no_data() -> None:
    (event,) = list(SseSplitter().feed(b": keep-alive\n\n"))
    assert event.data is None and event.json() is None


def test_usage_parsing() -> None:
    body = {
        "usage": {
            "prompt_tokens": 100,
            "completion_tokens": 7,
            "prompt_tokens_details": {"cached_tokens": 64},
        }
    }
    usage = parse_usage(body)
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens) == (100, 7, 64)
    assert parse_usage({"usage": None}) is None
    no_details = parse_usage({"usage": {"prompt_tokens": 3}})
    assert no_details is not None and no_details.cached_tokens is None


def test_usage_only_chunk_and_injection() -> None:
    assert is_usage_only_chunk({"choices": [], "usage": {"prompt_tokens": 1}})
    assert not is_usage_only_chunk({"choices": [{"delta": {}}], "usage": {"prompt_tokens": 1}})
    body = {"stream": True, "stream_options": {"other": 1}}
    assert not client_wants_usage(body)
    injected = with_usage_requested(body)
    assert injected["stream_options"] == {"other": 1, "include_usage": True}
    assert body["stream_options"] == {"other": 1}  # the client's body is not mutated
    assert client_wants_usage(injected)


def test_chunk_token_count() -> None:
    assert chunk_generated_tokens({"choices": [{"delta": {"content": " hello world"}}]}) == 2
    assert chunk_generated_tokens({"choices": [{"text": "x"}]}) == 1
    assert chunk_generated_tokens({"choices": [{"delta": {"role": "assistant"}}]}) == 0
