"""The official openai client through a real ``kvgate serve`` process."""

from __future__ import annotations

import openai
import pytest

from tests.gateway._engines import engines


@pytest.fixture(scope="module")
def gateway_and_engines():
    from tests.fixtures.gateway import start_gateway_process

    with engines(2) as started:
        gw = start_gateway_process(backends=[e.url for e in started])
        try:
            yield gw
        finally:
            gw.stop()


def test_non_streamed(gateway_and_engines) -> None:
    client = openai.OpenAI(base_url=gateway_and_engines.url + "/v1", api_key="unused")
    raw = client.chat.completions.with_raw_response.create(
        model=client.models.list().data[0].id,
        max_tokens=5,
        messages=[{"role": "user", "content": "Say something."}],
    )
    completion = raw.parse()
    assert completion.choices[0].message.content
    assert completion.usage is not None and completion.usage.prompt_tokens > 0
    assert raw.headers["X-KVGate-Node"] in ("node-0", "node-1")
    assert raw.headers["X-KVGate-Route-Reason"]
    assert raw.headers["X-KVGate-Admission"].startswith("admit")
    assert int(raw.headers["X-KVGate-Expected-Cached-Tokens"]) >= 0


def test_streamed_without_usage_gets_no_usage_chunk(gateway_and_engines) -> None:
    client = openai.OpenAI(base_url=gateway_and_engines.url + "/v1", api_key="unused")
    model = client.models.list().data[0].id
    chunks = list(
        client.chat.completions.create(
            model=model,
            max_tokens=6,
            stream=True,
            messages=[{"role": "user", "content": "Count."}],
        )
    )
    assert chunks and all(c.choices for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks)
    with_usage = list(
        client.chat.completions.create(
            model=model,
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "Count."}],
        )
    )
    assert with_usage[-1].usage is not None and not with_usage[-1].choices


def test_completions_endpoint(gateway_and_engines) -> None:
    client = openai.OpenAI(base_url=gateway_and_engines.url + "/v1", api_key="unused")
    model = client.models.list().data[0].id
    done = client.completions.create(model=model, prompt="Once upon a time", max_tokens=4)
    assert done.choices[0].text
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model, prompt=[1, 2, 3], max_tokens=4)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=4)
