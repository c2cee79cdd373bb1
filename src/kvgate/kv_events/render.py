"""An OpenAI request body → the prompt text its engine tokenizes, rendered as vLLM renders it.

For a model directory with a chat template (``chat_template.jinja``, else
``tokenizer_config.json``'s ``chat_template``), chat requests are rendered the way vLLM 0.32
does through transformers' ``apply_chat_template``:

* the messages are normalised as vLLM's ``parse_chat_messages`` does: string content becomes
  text parts, then either joined with ``"\\n"`` (a template that treats content as a string)
  or kept as ``{"type": "text", "text": …}`` parts (a template that loops over
  ``message.content``: vLLM's "openai" content format, detected from the template's AST the
  same way); tool messages' text parts are joined; assistant ``tool_calls`` keep their order
  and their ``arguments`` are parsed from JSON into objects (``{}`` when empty or invalid);
  ``developer`` becomes ``system`` when the template never names it;
* tools are what vLLM's ``ChatCompletionToolsParam.model_dump()`` gives: ``{"type",
  "function": {"name", "description", "parameters"[, "strict"]}}``, unknown keys dropped;
* the template runs in jinja2's ``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and
  ``lstrip_blocks``, the ``loopcontrols`` extension, transformers' ``tojson`` (no HTML
  escaping, ``ensure_ascii=False``), ``raise_exception`` and ``strftime_now``; its variables
  are ``messages``, ``tools``, ``documents``, ``add_generation_prompt`` (request field,
  default true), the tokenizer's named special tokens (``bos_token``, ``eos_token``, …) and
  the request's ``chat_template_kwargs`` / ``reasoning_effort`` where the template names
  them; ``continue_final_message`` cuts the text after the last message as transformers does;
* the text is tokenized with ``add_special_tokens`` false (the request may set it): the
  template writes BOS itself.

Completions are tokenized with ``add_special_tokens`` true (vLLM's default, the tokenizer's
post-processor adds BOS). Without a template, chat is rendered with kvgate's canonical
template (``kvgate.prompts``) and tokenized with special tokens, as engine-sim does.

What the gateway cannot reproduce exactly raises ``NotRenderable`` (multimodal parts, a
request-supplied template, truncation, token-id prompts): such a request is routed on the
approximate index.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kvgate.prompts import PromptError, completion_prompt, render_chat

# transformers' SPECIAL_TOKENS_ATTRIBUTES: the named special tokens a template may read
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
# vLLM's text-like content part types and the field that holds their text
_TEXT_PARTS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal"}
# the content-part keys vLLM knows (anything else on a text part is passed to the template)
_KNOWN_PART_FIELDS = frozenset(
    {
        "audio_embeds", "audio_url", "closed", "data", "file", "image_embeds", "image_pil",
        "image_url", "input_audio", "name", "prompt_cache_breakpoint", "refusal", "text",
        "thinking", "type", "uuid", "video_embeds", "video_url",
    }
)  # fmt: skip
_BILLING_HEADER = "x-anthropic-billing-header"
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
# request fields that change the prompt in ways the gateway does not reproduce
_UNSUPPORTED_FIELDS = ("chat_template", "truncate_prompt_tokens", "prompt_embeds")


class NotRenderable(ValueError):
    """The request's engine prompt cannot be reproduced exactly (names why)."""


@dataclass(frozen=True, slots=True)
class EnginePrompt:
    """The text the engine tokenizes and whether the tokenizer adds its special tokens."""

    text: str
    add_special_tokens: bool


class _GenerationTag(jinja2.ext.Extension):
    """transformers' ``{% generation %}`` block: renders its body unchanged."""

    tags = {"generation"}  # noqa: RUF012 (jinja2 declares it so)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_render", [])
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return str(caller())


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def make_environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


# -- template analysis (vLLM's content-format detection) -------------------------------
def _is_var(node: jinja2.nodes.Node, name: str) -> bool:
    return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name == name


def _is_attr(node: jinja2.nodes.Node, name: str, key: str) -> bool:
    if isinstance(node, jinja2.nodes.Getitem):
        return (
            _is_var(node.node, name)
            and isinstance(node.arg, jinja2.nodes.Const)
            and node.arg.value == key
        )
    if isinstance(node, jinja2.nodes.Getattr):
        return _is_var(node.node, name) and node.attr == key
    return False


def _is_access(node: jinja2.nodes.Node, name: str, key: str | None = None) -> bool:
    if isinstance(node, jinja2.nodes.Filter):
        return node.node is not None and _is_access(node.node, name, key)
    if isinstance(node, jinja2.nodes.Test):
        return _is_access(node.node, name, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return _is_access(node.node, name, key)
    return _is_attr(node, name, key) if key else _is_var(node, name)


def _aliases(root: jinja2.nodes.Template, name: str) -> list[str]:
    names, pending = [name], deque([name])
    while pending:
        current = pending.popleft()
        for assign in root.find_all(jinja2.nodes.Assign):
            if _is_access(assign.node, current) and isinstance(assign.target, jinja2.nodes.Name):
                names.append(assign.target.name)
                if assign.target.name != current:
                    pending.append(assign.target.name)
    return names


def _message_vars(root: jinja2.nodes.Template) -> list[str]:
    lists = _aliases(root, "messages")
    out = []
    for loop in root.find_all(jinja2.nodes.For):
        if any(_is_access(loop.iter, v) for v in lists) and isinstance(
            loop.target, jinja2.nodes.Name
        ):
            out.append(loop.target.name)
    return out


def _content_loops(root: jinja2.nodes.Template) -> Iterator[jinja2.nodes.For]:
    messages = _message_vars(root)
    macro_params: dict[int, set[str]] = {}
    in_macros: set[int] = set()
    for macro in root.find_all(jinja2.nodes.Macro):
        names = [a.name for a in macro.args]
        params: set[str] = set()
        for call in root.find_all(jinja2.nodes.Call):
            if not (isinstance(call.node, jinja2.nodes.Name) and call.node.name == macro.name):
                continue
            for i, arg in enumerate(call.args):
                if i < len(names) and any(_is_access(arg, m, "content") for m in messages):
                    params.add(names[i])
            for kw in call.kwargs:
                if kw.key in names and any(_is_access(kw.value, m, "content") for m in messages):
                    params.add(kw.key)
        for loop in macro.find_all(jinja2.nodes.For):
            in_macros.add(id(loop))
            if params:
                macro_params[id(loop)] = params
    for loop in root.find_all(jinja2.nodes.For):
        it = loop.iter
        by_message = any(_is_access(it, m, "content") for m in messages)
        by_name = isinstance(it, jinja2.nodes.Name) and (
            it.name in macro_params.get(id(loop), ())
            or (id(loop) not in in_macros and it.name == "content")
        )
        if by_message or by_name:
            yield loop


def content_format(ast: jinja2.nodes.Template) -> str:
    """``"openai"`` when the template loops over a message's content parts, else
    ``"string"`` (vLLM's ``_detect_content_format``)."""
    return "openai" if next(_content_loops(ast), None) is not None else "string"


# -- messages and tools as vLLM hands them to the template -----------------------------
def _strip_billing_header(parts: list[Any]) -> list[Any]:
    out: list[Any] = []
    for part in parts:
        text = part if isinstance(part, str) else None
        if isinstance(part, Mapping) and part.get("type") == "text":
            text = part.get("text")
        if not (isinstance(text, str) and text.startswith(_BILLING_HEADER)):
            out.append(part)
            continue
        rest = text.partition("\n")[2]
        if rest:
            out.append(rest if isinstance(part, str) else {**part, "text": rest})
    return out


def _content_parts(content: Any, wrap: bool, where: str) -> list[Any]:
    parts: list[Any] = []
    for i, part in enumerate(content):
        if isinstance(part, str):
            parts.append({"type": "text", "text": part} if wrap else part)
            continue
        if not isinstance(part, Mapping):
            raise PromptError(f"{where}[{i}] must be a string or a content part object")
        kind = part.get("type")
        field = _TEXT_PARTS.get(kind) if isinstance(kind, str) else None
        if field is None:
            raise NotRenderable(f"content part type {kind!r} is not rendered by the gateway")
        text = part.get(field)
        if text is None:
            continue  # vLLM skips a text part without text
        if not isinstance(text, str):
            raise PromptError(f"{where}[{i}].{field} must be a string")
        if wrap:
            parts.append(
                {"type": "text", "text": text}
                | {k: v for k, v in part.items() if k not in _KNOWN_PART_FIELDS}
            )
        else:
            parts.append(text)
    return parts


def _arguments(function: Mapping[str, Any]) -> dict[str, Any]:
    raw = function.get("arguments")
    if not raw:
        return {}
    if isinstance(raw, Mapping):
        return dict(raw)
    parsed = raw
    if isinstance(raw, str):
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError:
            return {}
    return parsed if isinstance(parsed, dict) else {}


def _tool_calls(calls: Any, where: str) -> list[Any] | None:
    if not isinstance(calls, list):
        raise PromptError(f"{where} must be a list")
    if not calls:
        return None
    out: list[Any] = []
    for i, call in enumerate(calls):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or call.get("type", "function") != "function":
            raise PromptError(f"{where}[{i}] must be a function call object")
        out.append({**call, "function": {**function, "arguments": _arguments(function)}})
    return out


def conversation(messages: Any, fmt: str) -> list[dict[str, Any]]:
    """The messages as vLLM's ``parse_chat_messages`` passes them to the template."""
    if not isinstance(messages, list) or not messages:
        raise PromptError("messages must be a non-empty list")
    wrap = fmt == "openai"
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise PromptError(f"messages[{i}] must be an object")
        role = message.get("role")
        if not isinstance(role, str):
            raise PromptError(f"messages[{i}].role is missing")
        content = message.get("content")
        if content is None:
            content = []
        elif isinstance(content, str):
            content = [{"type": "text", "text": content}]
        elif not isinstance(content, list):
            raise PromptError(f"messages[{i}].content must be a string or a list of parts")
        if role == "system":
            content = _strip_billing_header(content)
        parts = _content_parts(content, wrap, f"messages[{i}].content")
        msg: dict[str, Any] = {"role": role, "content": parts if wrap else "\n".join(parts)}
        if role == "assistant":
            calls = message.get("tool_calls")
            if calls is not None:
                parsed = _tool_calls(calls, f"messages[{i}].tool_calls")
                if parsed is not None:
                    msg["tool_calls"] = parsed
            reasoning = message.get("reasoning")
            if reasoning is not None:
                msg["reasoning"] = msg["reasoning_content"] = reasoning
        elif role == "tool":
            if "tool_call_id" in message:
                msg["tool_call_id"] = message["tool_call_id"]
            if wrap:
                msg["content"] = "\n".join(p["text"] for p in parts)
        for key in ("name", "task"):
            if isinstance(message.get(key), str):
                msg[key] = message[key]
        if role == "developer":
            msg["tools"] = message.get("tools")
        out.append(msg)
    return out


def _developer_as_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM's rewrite for a template without a developer role: developer → system, and all
    system messages merged into the first position when one is not first."""
    converted: list[dict[str, Any]] = []
    for msg in messages:
        if msg["role"] == "developer":
            msg = {k: v for k, v in msg.items() if k != "tools"} | {"role": "system"}
        converted.append(msg)
    systems: list[str] = []
    rest: list[dict[str, Any]] = []
    merge = False
    for i, msg in enumerate(converted):
        if msg["role"] != "system":
            rest.append(msg)
            continue
        if i > 0 or systems:
            merge = True
        content = msg.get("content", "")
        if isinstance(content, list):
            content = "\n".join(
                p["text"] if isinstance(p, Mapping) else p
                for p in content
                if isinstance(p, str) or (isinstance(p, Mapping) and "text" in p)
            )
        if content:
            systems.append(content)
    if not merge:
        return converted
    return [{"role": "system", "content": "\n\n".join(systems)}, *rest]


def tool_dicts(tools: Any) -> list[dict[str, Any]] | None:
    """Tools as vLLM's ``ChatCompletionToolsParam.model_dump()`` gives them."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise PromptError("tools must be a list")
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise PromptError(f"tools[{i}].function.name is required")
        if tool.get("type", "function") != "function":
            raise PromptError(f"tools[{i}].type must be 'function'")
        defer = tool.get("defer_loading")
        function: dict[str, Any] = {
            "name": fn["name"],
            "description": fn.get("description"),
            "parameters": fn.get("parameters"),
        }
        if fn.get("strict") is not None:
            function["strict"] = fn["strict"]
        fn_defer = fn.get("defer_loading", defer)
        if fn_defer is not None:
            function["defer_loading"] = fn_defer
        dumped: dict[str, Any] = {"type": "function", "function": function}
        if defer is not None:
            dumped["defer_loading"] = defer
        out.append(dumped)
    return out


# -- the template ----------------------------------------------------------------------
def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class ChatTemplate:
    """A model's chat template with its tokenizer's named special tokens."""

    def __init__(self, source: str | Mapping[str, str], special_tokens: Mapping[str, str]) -> None:
        sources = {"default": source} if isinstance(source, str) else dict(source)
        env = make_environment()
        try:
            self._templates = {name: env.from_string(s) for name, s in sources.items()}
            asts = {name: env.parse(s) for name, s in sources.items()}
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(f"chat template does not compile: {exc}") from None
        self._formats = {name: content_format(ast) for name, ast in asts.items()}
        self._vars = {name: jinja2.meta.find_undeclared_variables(a) for name, a in asts.items()}
        self._developer = {
            name: '"developer"' in s or "'developer'" in s for name, s in sources.items()
        }
        self.special_tokens = dict(special_tokens)

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> ChatTemplate | None:
        """The template of a Hugging Face model directory (``chat_template.jinja`` first,
        then ``tokenizer_config.json``), None when it has none."""
        root = Path(model_dir)
        config = _read_json(root / "tokenizer_config.json")
        tokens_map = _read_json(root / "special_tokens_map.json")
        special: dict[str, str] = {}
        for name in SPECIAL_TOKEN_NAMES:
            text = _token_text(config.get(name))
            if text is None:
                text = _token_text(tokens_map.get(name))
            if text is not None:
                special[name] = text
        jinja_file = root / "chat_template.jinja"
        source: str | dict[str, str] | None = None
        if jinja_file.is_file():
            source = jinja_file.read_text(encoding="utf-8")
        else:
            raw = config.get("chat_template")
            if isinstance(raw, str):
                source = raw
            elif isinstance(raw, list):
                source = {
                    str(t["name"]): str(t["template"])
                    for t in raw
                    if isinstance(t, Mapping) and "name" in t and "template" in t
                }
        if not source:
            return None
        return cls(source, special)

    def _pick(self, tools: list[dict[str, Any]] | None) -> str:
        names = self._templates
        if len(names) == 1:
            return next(iter(names))
        if tools is not None and "tool_use" in names:
            return "tool_use"
        if "default" in names:
            return "default"
        raise NotRenderable("the model has several chat templates and no default")

    def render(self, body: Mapping[str, Any]) -> str:
        """A chat request body's prompt text (see the module docstring)."""
        tools = tool_dicts(body.get("tools"))
        name = self._pick(tools)
        messages = conversation(body.get("messages"), self._formats[name])
        if not self._developer[name] and any(m["role"] == "developer" for m in messages):
            messages = _developer_as_system(messages)
        add_generation_prompt = body.get("add_generation_prompt", True)
        continue_final = body.get("continue_final_message", False)
        if continue_final and add_generation_prompt:
            raise PromptError("continue_final_message and add_generation_prompt exclude each other")
        wanted = self._vars[name]
        extra: dict[str, Any] = {}
        user = body.get("chat_template_kwargs") or {}
        if not isinstance(user, Mapping):
            raise PromptError("chat_template_kwargs must be an object")
        effort = body.get("reasoning_effort")
        if effort is not None:
            extra["reasoning_effort"] = effort
            if "enable_thinking" not in user:
                extra["enable_thinking"] = effort != "none"
        for key, value in user.items():
            if value is not None and value != "auto":
                extra[key] = value
        if {"chat_template", "tokenize"} & extra.keys():
            raise PromptError("chat_template_kwargs may not set chat_template or tokenize")
        kwargs = {k: v for k, v in extra.items() if k in wanted}
        kwargs.pop("add_generation_prompt", None)
        documents = body.get("documents")
        final = ""
        if continue_final:
            last = messages[-1] = dict(messages[-1])
            content = last.get("content")
            if isinstance(content, list):
                texts = [p for p in content if isinstance(p, Mapping) and "text" in p]
                if not texts:
                    raise PromptError("continue_final_message: the last message has no text")
                final = texts[-1]["text"]
                last["content"] = [
                    {**p, "text": p["text"] + _CONTINUE_TAG} if p is texts[-1] else p
                    for p in content
                ]
            else:
                final = str(content or "")
                last["content"] = final + _CONTINUE_TAG
        try:
            text = self._templates[name].render(
                **{**self.special_tokens, **kwargs},
                messages=messages,
                tools=tools,
                documents=documents,
                add_generation_prompt=bool(add_generation_prompt),
            )
        except jinja2.TemplateError as exc:
            raise PromptError(f"the chat template rejected the request: {exc}") from None
        if continue_final:
            tag = _CONTINUE_TAG.strip()
            if final.strip() not in text or tag not in text:
                raise PromptError("continue_final_message: the template dropped the last message")
            at = text.rindex(tag)
            text = (
                text[:at]
                if text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG
                else text[:at].rstrip()
            )
        return text


class PromptRenderer:
    """Request body → ``EnginePrompt``, for one model: its chat template when it has one,
    else kvgate's canonical chat rendering."""

    def __init__(self, template: ChatTemplate | None) -> None:
        self.template = template

    @classmethod
    def for_tokenizer(cls, tokenizer_path: str | Path) -> PromptRenderer:
        """The renderer of the model directory holding ``tokenizer.json``."""
        return cls(ChatTemplate.from_model_dir(Path(tokenizer_path).parent))

    def render(self, endpoint: str, body: Mapping[str, Any]) -> EnginePrompt:
        for field in _UNSUPPORTED_FIELDS:
            if body.get(field) is not None:
                raise NotRenderable(f"{field} is not reproduced by the gateway")
        if endpoint == "completions":
            add = body.get("add_special_tokens", True)
            return EnginePrompt(completion_prompt(body.get("prompt")), add is not False)
        if endpoint != "chat":
            raise NotRenderable(f"endpoint {endpoint!r} has no engine prompt")
        if self.template is None:
            return EnginePrompt(render_chat(body.get("messages") or [], body.get("tools")), True)
        add = body.get("add_special_tokens", False)
        return EnginePrompt(self.template.render(body), add is True)
