"""Reading, decoding and validating a request body, before anything is admitted.

Everything a client can get wrong about the bytes it sends ends here in a 400 (or 413/415)
OpenAI-style error, never deeper in the pipeline as a 500:

* size: over ``server.max_body_bytes`` → 413;
* ``Content-Encoding``: identity, gzip and deflate are decoded here (bounded, so a small
  compressed body cannot expand past the size limit); anything else → 415, a body that
  does not decode → 400;
* text: strict UTF-8 (no encoded surrogates, no other encodings);
* JSON: syntax, ``NaN``/``Infinity`` (not JSON), nesting deeper than ``MAX_DEPTH``,
  lone surrogates from ``\\ud800``-style escapes (they cannot be re-encoded for the engine);
* types and ranges of every field the gateway itself reads (``validate_generation``).

Fields the gateway does not read are forwarded untouched; the engine judges them.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Callable
from typing import Any

import msgspec
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from kvgate.gateway.errors import ApiError

MAX_DEPTH = 64  # deeper JSON than any OpenAI body needs (tool schemas nest ~10 levels)
MAX_INT = 2**31 - 1  # token counts beyond int32 are nonsense and overflow store counters
ACCEPTED_ENCODINGS = ("identity", "gzip", "x-gzip", "deflate")
AIOHTTP_DECODES = ("gzip", "deflate")  # as the whole header value
_SURROGATE = re.compile("[\ud800-\udfff]")
_NUMBER = (int, float)
# msgspec's decoder accepts a subset of what json.loads does (it refuses NaN/Infinity,
# lone surrogates, invalid UTF-8, numbers out of float range, a BOM) and decodes that
# subset to the same objects, ~3× faster; anything it refuses takes json.loads's path,
# which gives the answer (and the error message) it always did
_FAST_JSON = msgspec.json.Decoder()
_FAST_JSON_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)


def _bad(message: str, *, code: str, param: str | None = None, status: int = 400) -> ApiError:
    return ApiError(status, message, param=param, code=code)


# -- bytes ------------------------------------------------------------------------------
async def read_body(request: web.Request, limit: int) -> bytes:
    """The request body, decoded from its Content-Encoding, at most ``limit`` bytes."""
    encodings = _content_encodings(request)
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(limit, request.content_length)
    try:
        raw = await _read_raw(request, limit) if encodings else await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise _too_large(limit) from None
    except web.HTTPException:
        raise
    except (RequestPayloadError, HttpProcessingError) as exc:
        # aiohttp's own payload decoding: a broken Content-Encoding, a bad chunk
        raise _bad(
            f"request body could not be decoded: {_first_line(exc)}",
            code="bad_encoding" if request.headers.get("Content-Encoding") else "bad_body",
            param="Content-Encoding" if request.headers.get("Content-Encoding") else None,
        ) from None
    if len(raw) > limit:
        raise _too_large(limit)
    for encoding in reversed(encodings):
        raw = _decode(raw, encoding, limit)
    return raw


async def _read_raw(request: web.Request, limit: int) -> bytes:
    """The undecoded body, stopping as soon as it is over ``limit``."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.read(65536):
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _first_line(exc: BaseException) -> str:
    text = str(exc).replace("400, message:", "").strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__


def _too_large(limit: int, size: int | None = None) -> ApiError:
    told = f"request body is {size} bytes; " if size is not None else "request body "
    return _bad(f"{told}the limit is {limit} bytes", code="body_too_large", status=413)


def _content_encodings(request: web.Request) -> list[str]:
    """The codings to undo, outermost last (RFC 9110 lists them in the order applied).

    aiohttp decodes a body whose header is exactly one of gzip/deflate itself (then
    ``request.content`` yields decoded bytes); every other accepted form (``x-gzip``, a
    list such as ``gzip, identity``) is decoded here.
    """
    header = request.headers.get("Content-Encoding", "")
    names = [n.strip().lower() for n in header.split(",") if n.strip()]
    for name in names:
        if name not in ACCEPTED_ENCODINGS:
            raise _bad(
                f"unsupported Content-Encoding {name!r}; use gzip, deflate or none",
                code="unsupported_encoding",
                param="Content-Encoding",
                status=415,
            )
    if header.strip().lower() in AIOHTTP_DECODES:
        return []
    return [n for n in names if n != "identity"]


def _decode(raw: bytes, encoding: str, limit: int) -> bytes:
    wbits = 16 + zlib.MAX_WBITS if encoding in ("gzip", "x-gzip") else zlib.MAX_WBITS
    decoder = zlib.decompressobj(wbits)
    try:
        out = decoder.decompress(raw, limit + 1)
    except zlib.error:
        raise _bad(
            f"request body is not valid {encoding} data",
            code="bad_encoding",
            param="Content-Encoding",
        ) from None
    if len(out) > limit:
        raise _too_large(limit)
    if not decoder.eof:
        raise _bad(f"{encoding} request body is truncated", code="bad_encoding")
    return out


# -- JSON -------------------------------------------------------------------------------
def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """Strict UTF-8 JSON object with bounded nesting and no lone surrogates."""
    try:
        fast = _FAST_JSON.decode(raw)
    except _FAST_JSON_ERRORS:
        return _parse_json_object(raw)
    if not isinstance(fast, dict):
        return _parse_json_object(raw)
    check_tree(fast, surrogates=False)  # msgspec refuses lone surrogates itself
    return fast


def _parse_json_object(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise _bad("request body is empty; send a JSON object", code="invalid_json")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _bad(
            f"request body is not valid UTF-8 (byte {exc.start})", code="invalid_encoding"
        ) from None
    if text.startswith("\ufeff"):
        text = text[1:]
    try:
        body = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise _too_deep() from None
    except ValueError as exc:
        raise _bad(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise _bad("request body must be a JSON object", code="invalid_json")
    # a surrogate can only come from a \u escape: strict UTF-8 decoding rejected the rest
    check_tree(body, surrogates="\\u" in text or "\\U" in text)
    return body


def _too_deep() -> ApiError:
    return _bad(f"request body nests deeper than {MAX_DEPTH} levels", code="too_deep")


def check_tree(value: Any, *, surrogates: bool) -> None:
    """Depth limit and (when asked) lone-surrogate check, iteratively (no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            if depth > MAX_DEPTH:
                raise _too_deep()
            for key, item in node.items():
                if surrogates and _SURROGATE.search(key):
                    raise _surrogate()
                if isinstance(item, dict | list):
                    stack.append((item, depth + 1))
                elif surrogates and isinstance(item, str) and _SURROGATE.search(item):
                    raise _surrogate()
        elif isinstance(node, list):
            if depth > MAX_DEPTH:
                raise _too_deep()
            for item in node:
                if isinstance(item, dict | list):
                    stack.append((item, depth + 1))
                elif surrogates and isinstance(item, str) and _SURROGATE.search(item):
                    raise _surrogate()


def _surrogate() -> ApiError:
    return _bad(
        "request body contains a lone UTF-16 surrogate (\\ud800-\\udfff); send valid Unicode",
        code="invalid_encoding",
    )


async def read_json_object(request: web.Request, limit: int) -> tuple[dict[str, Any], bytes]:
    """(parsed object, the decoded bytes) of a JSON request body, or ApiError."""
    raw = await read_body(request, limit)
    return parse_json_object(raw), raw


# -- fields the gateway reads -----------------------------------------------------------
def _type_error(name: str, expected: str) -> ApiError:
    return _bad(f"'{name}' must be {expected}", param=name, code="invalid_type")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, _NUMBER) and not isinstance(value, bool)


def _positive_int(name: str, value: Any) -> None:
    if not _is_int(value) or not 1 <= value <= MAX_INT:
        raise _bad(
            f"'{name}' must be an integer from 1 to {MAX_INT}", param=name, code="invalid_value"
        )


def _optional(check: Callable[[Any], bool], expected: str) -> Callable[[str, Any], None]:
    def validate(name: str, value: Any) -> None:
        if value is not None and not check(value):
            raise _type_error(name, expected)

    return validate


def _stream_options(name: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise _type_error(name, "an object")
    include = value.get("include_usage")
    if include is not None and not isinstance(include, bool):
        raise _type_error(f"{name}.include_usage", "a boolean")


def _stop(name: str, value: Any) -> None:
    if value is None or isinstance(value, str):
        return
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise _type_error(name, "a string or a list of strings")


def _tools(name: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise _type_error(name, "a list of objects")


def _model(name: str, value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise _type_error(name, "a non-empty string")


def _int_in_range(name: str, value: Any) -> None:
    if value is not None and (not _is_int(value) or abs(value) > MAX_INT):
        raise _type_error(name, f"an integer within ±{MAX_INT}")


_FIELDS: dict[str, Callable[[str, Any], None]] = {
    "model": _model,
    "stream": _optional(lambda v: isinstance(v, bool), "a boolean"),
    "stream_options": _stream_options,
    "max_tokens": lambda n, v: None if v is None else _positive_int(n, v),
    "max_completion_tokens": lambda n, v: None if v is None else _positive_int(n, v),
    "tools": _tools,
    "temperature": _optional(_is_number, "a number"),
    "top_p": _optional(_is_number, "a number"),
    "presence_penalty": _optional(_is_number, "a number"),
    "frequency_penalty": _optional(_is_number, "a number"),
    "n": lambda n, v: None if v is None else _positive_int(n, v),
    "seed": _int_in_range,
    "priority": _int_in_range,
    "stop": _stop,
    "user": _optional(lambda v: isinstance(v, str), "a string"),
}


def _messages(value: Any) -> None:
    if not isinstance(value, list) or not value:
        raise _type_error("messages", "a non-empty list of message objects")
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise _type_error(f"messages[{i}]", "an object")
        role = message.get("role")
        if not isinstance(role, str):
            raise _type_error(f"messages[{i}].role", "a string")
        content = message.get("content")
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise _type_error(f"messages[{i}].content", "a string or a list of content parts")
        for j, part in enumerate(content):
            if isinstance(part, str):
                continue
            if not isinstance(part, dict):
                raise _type_error(f"messages[{i}].content[{j}]", "a content part object")
            if part.get("type") == "text" and not isinstance(part.get("text"), str):
                raise _type_error(f"messages[{i}].content[{j}].text", "a string")


def _prompt(value: Any) -> None:
    if isinstance(value, str):
        return
    if isinstance(value, list) and value and all(isinstance(p, str) for p in value):
        return
    if isinstance(value, list) and value and all(_is_int(p) for p in value):
        return  # token ids: the route layer answers that it needs text
    raise _type_error("prompt", "a string or a list of strings")


def validate_generation(body: dict[str, Any], endpoint: str) -> None:
    """Types (and the ranges the gateway relies on) of the fields it reads."""
    required = "messages" if endpoint == "chat" else "prompt"
    if required not in body:
        raise _bad(f"missing required field '{required}'", param=required, code="missing_field")
    if endpoint == "chat":
        _messages(body["messages"])
    else:
        _prompt(body["prompt"])
    for name, check in _FIELDS.items():
        if name in body:
            check(name, body[name])
