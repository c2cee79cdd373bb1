"""The engine-prompt renderer against reference cases (no transformers, no vLLM).

Each case states what vLLM 0.32 hands a chat template and what transformers' sandbox does
with it; ``tests/real_vllm/test_parity.py`` checks the same renderer id for id against a
real engine's render endpoints.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvgate.kv_events.render import (
    ChatTemplate,
    NotRenderable,
    PromptRenderer,
    content_format,
    make_environment,
    tool_dicts,
)
from kvgate.kv_events.tokenizer import PromptHasher
from kvgate.prompts import PromptError, render_chat

SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}
STRING_TPL = (
    "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)
PARTS_TPL = "{% for m in messages %}{% for p in m.content %}<{{ p.text }}>{% endfor %}{% endfor %}"


def chat(template: str, body: dict[str, Any]) -> str:
    return ChatTemplate(template, SPECIAL).render(body)


def test_string_content_format_joins_text_parts_with_newlines() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, "b"]},
            {"role": "assistant", "content": None},
        ]
    }
    assert chat(STRING_TPL, body) == "<s>[system]sys[user]a\nb[assistant][assistant]"
    assert chat(STRING_TPL, {**body, "add_generation_prompt": False}).endswith("[assistant]")
    assert not chat(STRING_TPL, {**body, "add_generation_prompt": False}).endswith(
        "[assistant][assistant]"
    )


def test_a_template_looping_over_content_gets_text_parts() -> None:
    env = make_environment()
    assert content_format(env.parse(PARTS_TPL)) == "openai"
    assert content_format(env.parse(STRING_TPL)) == "string"
    aliased = "{% set msgs = messages %}{% for x in msgs %}{% for c in x['content'] %}{% endfor %}{% endfor %}"
    assert content_format(env.parse(aliased)) == "openai"
    body = {"messages": [{"role": "user", "content": "hello"}, {"role": "user", "content": None}]}
    assert chat(PARTS_TPL, body) == "<hello>"  # string content wrapped, None content empty


def test_tools_are_dumped_as_vllm_dumps_them_and_tojson_escapes_no_html() -> None:
    tools = [
        {"type": "function", "function": {"name": "f", "description": "é <b>&", "x": 1}},
        {
            "type": "function",
            "function": {"name": "g", "parameters": {"b": 1, "a": 2}, "strict": True},
        },
    ]
    dumped = tool_dicts(tools)
    assert dumped == [
        {
            "type": "function",
            "function": {"name": "f", "description": "é <b>&", "parameters": None},
        },
        {
            "type": "function",
            "function": {
                "name": "g",
                "description": None,
                "parameters": {"b": 1, "a": 2},
                "strict": True,
            },
        },
    ]
    text = chat(
        "{{ tools | tojson }}", {"messages": [{"role": "user", "content": "q"}], "tools": tools}
    )
    assert text == json.dumps(dumped, ensure_ascii=False)
    assert "\\u00e9" not in text and "&lt;" not in text
    with pytest.raises(PromptError):
        tool_dicts([{"type": "function", "function": {}}])


def test_tool_call_arguments_are_parsed_into_objects() -> None:
    tpl = "{% for c in messages[0].tool_calls %}{{ c.function.arguments | tojson }};{% endfor %}"
    calls = [
        {
            "id": "1",
            "type": "function",
            "function": {"name": "f", "arguments": '{"b": 1, "a": "é"}'},
        },
        {"id": "2", "type": "function", "function": {"name": "f", "arguments": ""}},
        {"id": "3", "type": "function", "function": {"name": "f", "arguments": "{bad"}},
        {"id": "4", "type": "function", "function": {"name": "f", "arguments": "[1]"}},
    ]
    body = {"messages": [{"role": "assistant", "content": None, "tool_calls": calls}]}
    assert chat(tpl, body) == '{"b": 1, "a": "é"};{};{};{};'
    # an empty list of calls is dropped: the template sees no tool_calls at all
    empty = {"messages": [{"role": "assistant", "content": "x", "tool_calls": []}]}
    assert chat("{{ messages[0].tool_calls is defined }}", empty) == "False"


def test_tool_results_given_as_parts_become_one_string() -> None:
    tpl = "{% for m in messages %}{% for p in m.content %}{% endfor %}{{ m.content is string }}|{% endfor %}"
    body = {
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "tool", "tool_call_id": "1", "content": [{"type": "text", "text": "r"}]},
        ]
    }
    assert chat(tpl, body) == "False|True|"


def test_developer_becomes_system_when_the_template_never_names_it() -> None:
    body = {
        "messages": [
            {"role": "user", "content": "u"},
            {"role": "developer", "content": "d"},
            {"role": "system", "content": "s"},
        ]
    }
    assert chat(STRING_TPL, body) == "<s>[system]d\n\ns[user]u[assistant]"
    named = STRING_TPL + "{# 'developer' #}"
    assert chat(named, body) == "<s>[user]u[developer]d[system]s[assistant]"


def test_trim_and_lstrip_blocks_and_template_errors() -> None:
    assert (
        chat("{% if true %}\n  X{% endif %}\n", {"messages": [{"role": "user", "content": ""}]})
        == "  X"
    )
    tpl = "{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}{% endif %}"
    with pytest.raises(PromptError, match="system first"):
        chat(tpl, {"messages": [{"role": "user", "content": "u"}]})


def test_continue_final_message_cuts_after_the_last_message() -> None:
    tpl = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
    body = {
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "The an"}],
        "add_generation_prompt": False,
        "continue_final_message": True,
    }
    assert chat(tpl, body) == "<user>q</user><assistant>The an"
    with pytest.raises(PromptError):
        chat(tpl, {**body, "add_generation_prompt": True})


def test_template_kwargs_reach_the_template_only_where_it_names_them() -> None:
    tpl = "{{ enable_thinking }}|{{ reasoning_effort }}|{{ other is defined }}"
    body = {
        "messages": [{"role": "user", "content": "q"}],
        "reasoning_effort": "low",
        "chat_template_kwargs": {"other": 1, "unused": 2},
    }
    assert chat(tpl, body) == "True|low|True"
    assert chat(tpl, {"messages": body["messages"]}) == "||False"


def test_non_text_parts_and_request_templates_are_not_renderable() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:"}}
    with pytest.raises(NotRenderable):
        chat(STRING_TPL, {"messages": [{"role": "user", "content": [image]}]})
    renderer = PromptRenderer(ChatTemplate(STRING_TPL, SPECIAL))
    with pytest.raises(NotRenderable):
        renderer.render(
            "chat", {"messages": [{"role": "user", "content": "q"}], "chat_template": "x"}
        )


def _model_dir(root: Path, tokenizer_path: Path, template: str | None) -> Path:
    d = root / "model"
    d.mkdir()
    (d / "tokenizer.json").write_bytes(tokenizer_path.read_bytes())
    config: dict[str, Any] = {"bos_token": {"content": "[UNK]"}, "eos_token": "</s>"}
    if template is not None:
        config["chat_template"] = template
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    return d


def test_chat_adds_no_special_tokens_and_completions_do(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    d = _model_dir(
        tmp_path,
        tokenizer_path,
        "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}",
    )
    hasher = PromptHasher(d / "tokenizer.json")
    assert hasher.renderer.template is not None
    assert hasher.renderer.template.special_tokens == {"bos_token": "[UNK]", "eos_token": "</s>"}
    body = {"messages": [{"role": "user", "content": "cache prefix"}]}
    prompt = hasher.renderer.render("chat", body)
    assert (prompt.text, prompt.add_special_tokens) == ("[UNK]cache prefix", False)
    assert (
        hasher.engine_tokens("chat", body)
        == hasher.tokenizer.encode("[UNK]cache prefix", add_special_tokens=False).ids
    )
    assert (
        hasher.engine_tokens("chat", {**body, "add_special_tokens": True})
        == hasher.tokenizer.encode("[UNK]cache prefix", add_special_tokens=True).ids
    )
    completion = hasher.renderer.render("completions", {"prompt": "cache prefix"})
    assert completion.add_special_tokens is True


def test_without_a_template_chat_is_kvgates_canonical_rendering(tokenizer_path: Path) -> None:
    hasher = PromptHasher(tokenizer_path)  # a bare tokenizer.json: no model directory
    assert hasher.renderer.template is None
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    prompt = hasher.renderer.render("chat", {"messages": messages})
    assert (prompt.text, prompt.add_special_tokens) == (render_chat(messages), True)


def test_chat_template_jinja_wins_over_tokenizer_config(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    d = _model_dir(tmp_path, tokenizer_path, "config")
    (d / "chat_template.jinja").write_text("file")
    template = ChatTemplate.from_model_dir(d)
    assert (
        template is not None
        and template.render({"messages": [{"role": "user", "content": ""}]}) == "file"
    )
