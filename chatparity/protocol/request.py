"""The Chat Completions request: OpenAI's schema, validated with OpenAI's errors."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from functools import partial
from typing import Any, Literal, TypeVar

import orjson

from .errors import APIError, invalid_json

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


@dataclass(frozen=True, slots=True)
class Message:
    """One entry of ``messages``; array content is flattened to its text."""

    role: Role
    content: str | None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool = False


@dataclass(frozen=True, slots=True)
class ToolChoice:
    mode: Literal["none", "auto", "required", "function"]
    name: str | None = None


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    type: Literal["text", "json_object", "json_schema"]
    schema: dict[str, Any] | None = None
    name: str | None = None
    strict: bool = False


@dataclass(frozen=True, slots=True)
class Limits:
    """The server's caps on a request's size, on top of OpenAI's schema; None is no cap."""

    max_messages: int | None = None
    max_content_chars: int | None = None  # per content string: a content or one text part


NO_LIMITS = Limits()


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A validated request. ``body`` keeps the JSON object exactly as sent."""

    model: str
    messages: list[Message]
    body: dict[str, Any]
    stream: bool = False
    include_usage: bool = False
    n: int = 1
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    logprobs: bool = False
    top_logprobs: int = 0
    response_format: ResponseFormat | None = None
    tools: list[Tool] = field(default_factory=list)
    tool_choice: ToolChoice = ToolChoice("none")
    parallel_tool_calls: bool = True
    reasoning_effort: str | None = None
    service_tier: str | None = None
    user: str | None = None
    # Not the client's: what the serving alias lets an upstream receive beyond the
    # sampling and format parameters (ModelAlias.forwarded_params).
    forwarded_params: frozenset[str] = frozenset()


# Deeper JSON is refused as unparseable, like JSON nested past the parser's own limit:
# bodies are encoded again later (the request log, upstream backends, grammars), and
# neither orjson (254 levels) nor the stdlib (the recursion limit) encodes any depth.
# Requests nest a few levels, JSON Schemas in them a few more.
MAX_DEPTH = 128


def decode_body(raw: bytes) -> Any:
    """The JSON value of a request body; OpenAI's invalid-JSON 400 if there is none.

    Invalid UTF-8, NaN and Infinity literals, lone surrogates and JSON nested
    more than :data:`MAX_DEPTH` levels are all invalid JSON.
    """
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise invalid_json() from None
    if _nested_deeper_than(value, MAX_DEPTH):
        raise invalid_json()
    return value


def _nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether more than ``limit`` arrays or objects nest; level by level, without recursion."""
    level = [value] if isinstance(value, dict | list) else []
    for _ in range(limit):
        level = [
            child
            for container in level
            for child in (container.values() if isinstance(container, dict) else container)
            if isinstance(child, dict | list)
        ]
        if not level:
            return False
    return bool(level)


def parse_chat_request(body: Any, limits: Limits = NO_LIMITS) -> ChatRequest:
    """Validate a decoded JSON body; raise :class:`APIError` as OpenAI would.

    The checks run in OpenAI's order: the required keys, unknown keys, each
    parameter in the order the body lists them, then the rules that span
    several parameters or messages. ``limits`` are enforced with the errors
    OpenAI gives for its own maximum lengths.
    """
    if not isinstance(body, dict):
        raise invalid_json()
    if body.get("model") is None:
        raise APIError("you must provide a model parameter")
    if body.get("messages") is None:
        raise _missing("messages")
    unknown = sorted(body.keys() - _PARAMETERS.keys())
    if unknown:
        plural = "s" if len(unknown) > 1 else ""
        raise APIError(f"Unrecognized request argument{plural} supplied: {', '.join(unknown)}")
    parsers = _PARAMETERS | {"messages": partial(_messages, limits=limits)}
    given = {key: parsers[key](value, key) for key, value in body.items() if value is not None}

    for key, needed, message in _ONLY_WITH:
        if key in given and not given.get(needed):
            raise APIError(message, param=key)
    choice = _resolve_tool_choice(given.get("tool_choice"), given.get("tools", []))
    messages: list[Message] = given["messages"]
    _check_conversation(messages, body["messages"])
    response_format: ResponseFormat | None = given.get("response_format")
    json_object = response_format is not None and response_format.type == "json_object"
    if json_object and not any("json" in (m.content or "").lower() for m in messages):
        raise APIError(
            "'messages' must contain the word 'json' in some form, to use 'response_format'"
            " of type 'json_object'.",
            param="messages",
        )

    settings = {key: value for key, value in given.items() if key in _FIELDS}
    settings.update(
        body=body,
        include_usage=given.get("stream_options", False),
        max_tokens=given.get("max_completion_tokens", given.get("max_tokens")),
        tool_choice=choice,
    )
    return ChatRequest(**settings)


# Errors, in OpenAI's words.


def _missing(param: str) -> APIError:
    return APIError(
        f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
    )


def _kind(value: Any) -> str:
    """How OpenAI names the JSON type of a value it did not expect."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def _wrong_type(param: str, expected: str, value: Any) -> APIError:
    return APIError(
        f"Invalid type for '{param}': expected {expected}, but got {_kind(value)} instead.",
        param=param,
        code="invalid_type",
    )


def _listing(values: Sequence[str], conjunction: str) -> str:
    """``'a', 'b', and 'c'``, ``'a' or 'b'``, ``'a'``."""
    quoted = [f"'{value}'" for value in values]
    if len(quoted) < 3:
        return f" {conjunction} ".join(quoted)
    return f"{', '.join(quoted[:-1])}, {conjunction} {quoted[-1]}"


def _out_of_range(param: str, kind: str, value: float, bound: int, *, above: bool) -> APIError:
    beyond, side, sign = ("above", "max", "<=") if above else ("below", "min", ">=")
    return APIError(
        f"Invalid '{param}': {kind} {beyond} {side}imum value. Expected a value {sign} {bound},"
        f" but got {value} instead.",
        param=param,
        code=f"{kind}_{beyond}_{side}_value",
    )


def _too_long(param: str, kind: str, limit: int, length: int) -> APIError:
    article = "an" if kind == "array" else "a"
    return APIError(
        f"Invalid '{param}': {kind} too long. Expected {article} {kind} with maximum length"
        f" {limit}, but got {article} {kind} with length {length} instead.",
        param=param,
        code=f"{kind}_above_max_length",
    )


def _dotted(param: str) -> str:
    """How OpenAI's semantic checks spell a path: ``messages.[0].content``."""
    return param.replace("[", ".[")


# Values. A parser takes a JSON value and its path, and returns the value parsed.

_T = TypeVar("_T")
_S = TypeVar("_S", bound=str)
_Parser = Callable[[Any, str], Any]

_NAME = re.compile(r"[a-zA-Z0-9_-]+")
_TOKEN_ID = re.compile(r"[0-9]+")
MAX_TOKEN_ID = 2**31 - 1
"""The largest token id a ``logit_bias`` key may name (llama.cpp's are 32-bit)."""


def _string(value: Any, param: str, max_length: int | None = None) -> str:
    if not isinstance(value, str):
        raise _wrong_type(param, "a string", value)
    if max_length is not None and len(value) > max_length:
        raise _too_long(param, "string", max_length, len(value))
    return value


def _name(value: Any, param: str) -> str:
    """A function, schema or participant name."""
    name = _string(value, param, max_length=64)
    if not _NAME.fullmatch(name):
        raise APIError(
            f"Invalid '{param}': string does not match pattern. Expected a string that matches"
            " the pattern '^[a-zA-Z0-9_-]+$'.",
            param=param,
            code="invalid_value",
        )
    return name


def _boolean(value: Any, param: str) -> bool:
    if not isinstance(value, bool):
        raise _wrong_type(param, "a boolean", value)
    return value


def _integer(value: Any, param: str, lo: int | None = None, hi: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _wrong_type(param, "an integer", value)
    _check_range(value, param, "integer", lo, hi)
    return value


def _decimal(value: Any, param: str, lo: int | None = None, hi: int | None = None) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise _wrong_type(param, "a decimal", value)
    _check_range(value, param, "decimal", lo, hi)
    return float(value)


def _check_range(value: float, param: str, kind: str, lo: int | None, hi: int | None) -> None:
    if lo is not None and value < lo:
        raise _out_of_range(param, kind, value, lo, above=False)
    if hi is not None and value > hi:
        raise _out_of_range(param, kind, value, hi, above=True)


def _enum(value: Any, param: str, allowed: Sequence[_S]) -> _S:
    if not isinstance(value, str):
        raise _wrong_type(param, f"one of {_listing(allowed, 'or')}", value)
    for option in allowed:
        if value == option:
            return option
    raise APIError(
        f"Invalid value: '{value}'. Supported values are: {_listing(allowed, 'and')}.",
        param=param,
        code="invalid_value",
    )


def _object(value: Any, param: str, expected: str = "an object") -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _wrong_type(param, expected, value)
    return value


def _array(
    value: Any, param: str, expected: str = "an array of objects", max_length: int | None = None
) -> list[Any]:
    """A JSON array of at least one item."""
    if not isinstance(value, list):
        raise _wrong_type(param, expected, value)
    if not value:
        raise APIError(
            f"Invalid '{param}': empty array. Expected an array with minimum length 1, but got"
            " an empty array instead.",
            param=param,
            code="empty_array",
        )
    if max_length is not None and len(value) > max_length:
        raise _too_long(param, "array", max_length, len(value))
    return value


def _each(value: Any, param: str, item: Callable[[Any, str], _T], **array: Any) -> list[_T]:
    """A JSON array parsed item by item, each at its ``param[i]`` path."""
    return [item(each, f"{param}[{i}]") for i, each in enumerate(_array(value, param, **array))]


def _required(obj: dict[str, Any], key: str, param: str, parse: Callable[[Any, str], _T]) -> _T:
    """Member ``key`` of the object at ``param``; null is a type error."""
    if key not in obj:
        raise _missing(f"{param}.{key}")
    return parse(obj[key], f"{param}.{key}")


def _optional(
    obj: dict[str, Any], key: str, param: str, parse: Callable[[Any, str], _T]
) -> _T | None:
    """Member ``key`` of the object at ``param``; absent and null are None."""
    value = obj.get(key)
    return None if value is None else parse(value, f"{param}.{key}")


# Parameters.

_ROLES: tuple[Role, ...] = ("system", "assistant", "user", "function", "tool", "developer")
_PART_TYPES = ("text", "image_url", "input_audio", "refusal", "audio", "file")
_FORMATS: tuple[Literal["text", "json_object", "json_schema"], ...] = (
    "text",
    "json_object",
    "json_schema",
)
_TOOL_MODES: tuple[Literal["none", "auto", "required"], ...] = ("none", "auto", "required")
_FUNCTION = partial(_enum, allowed=("function",))


def _messages(value: Any, param: str, limits: Limits = NO_LIMITS) -> list[Message]:
    message = partial(_message, max_chars=limits.max_content_chars)
    return _each(value, param, message, max_length=limits.max_messages)


def _message(value: Any, param: str, max_chars: int | None = None) -> Message:
    message = _object(value, param)
    role = _required(message, "role", param, partial(_enum, allowed=_ROLES))
    content_of = partial(_content, max_length=max_chars)
    # Only the developer schema requires content; a null content in another role
    # is a semantic error, reported once the whole body is well-formed.
    if role == "developer":
        content: str | None = _required(message, "content", param, content_of)
    else:
        content = _optional(message, "content", param, content_of)
    name = _optional(message, "name", param, _name)
    if role == "function" and name is None:
        raise _missing(f"{param}.name")
    tool_calls = None
    if role == "assistant":
        _optional(message, "refusal", param, _string)
        _optional(message, "function_call", param, _function_call_made)
        tool_calls = _optional(message, "tool_calls", param, _tool_calls)
    return Message(
        role,
        content,
        name=name,
        tool_calls=tool_calls,
        tool_call_id=_required(message, "tool_call_id", param, _string) if role == "tool" else None,
    )


def _content(value: Any, param: str, max_length: int | None = None) -> str:
    """A string, or an array of parts whose texts are joined."""
    if isinstance(value, str):
        return _string(value, param, max_length)
    part = partial(_text_part, max_length=max_length)
    return "".join(_each(value, param, part, expected="one of a string or array of objects"))


def _text_part(value: Any, param: str, max_length: int | None = None) -> str:
    part = _object(value, param)
    kind = _required(part, "type", param, partial(_enum, allowed=_PART_TYPES))
    if kind != "text":
        raise APIError(
            f"Invalid content type. {kind} is only supported by certain models.",
            param=_dotted(f"{param}.type"),
        )
    return _required(part, "text", param, partial(_string, max_length=max_length))


def _tool_calls(value: Any, param: str) -> list[dict[str, Any]]:
    return _each(value, param, _tool_call)


def _tool_call(value: Any, param: str) -> dict[str, Any]:
    call = _object(value, param)
    _required(call, "id", param, _string)
    _required(call, "type", param, _FUNCTION)
    function = _required(call, "function", param, _object)
    _required(function, "name", f"{param}.function", _string)
    _required(function, "arguments", f"{param}.function", _string)
    return call


def _function_call_made(value: Any, param: str) -> dict[str, Any]:
    """The deprecated ``function_call`` of an earlier assistant message."""
    call = _object(value, param)
    _required(call, "name", param, _string)
    _optional(call, "arguments", param, _string)
    return call


def _logit_bias(value: Any, param: str) -> dict[int, float]:
    """Token ids, as strings, mapped to a bias in [-100, 100]."""
    return {
        _token_id(key, param): _decimal(bias, f"{param}.{key}", -100, 100)
        for key, bias in _object(value, param).items()
    }


def _token_id(key: str, param: str) -> int:
    if not _TOKEN_ID.fullmatch(key):
        raise APIError(
            f"Invalid key in '{param}': {key}. You should only be submitting non-negative"
            " integers.",
            param=param,
        )
    # Measured before int(), which refuses more than 4,300 digits with a ValueError.
    digits = key.lstrip("0") or "0"
    if len(digits) > len(str(MAX_TOKEN_ID)) or int(digits) > MAX_TOKEN_ID:
        raise APIError(
            f"Invalid key in '{param}': {key}. Token ids are at most {MAX_TOKEN_ID}.",
            param=param,
            code="invalid_value",
        )
    return int(digits)


def _metadata(value: Any, param: str) -> dict[str, str]:
    pairs = _object(value, param, "a metadata object")
    if len(pairs) > 16:
        raise APIError(
            f"Invalid '{param}': too many properties. Expected an object with at most 16"
            f" properties, but got an object with {len(pairs)} properties instead.",
            param=param,
            code="object_above_max_properties",
        )
    return {key: _string(text, f"{param}.{key}", max_length=512) for key, text in pairs.items()}


def _stop(value: Any, param: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    return _each(
        value, param, _string, expected="one of a string or array of strings", max_length=4
    )


def _stream_options(value: Any, param: str) -> bool:
    """Whether the stream ends with a usage chunk."""
    return _optional(_object(value, param), "include_usage", param, _boolean) or False


def _function_call(value: Any, param: str) -> str | dict[str, Any]:
    if isinstance(value, str):
        return value
    return _object(value, param, "one of one of 'none' or 'auto' or object")


def _response_format(value: Any, param: str) -> ResponseFormat:
    spec = _object(value, param)
    kind = _required(spec, "type", param, partial(_enum, allowed=_FORMATS))
    if kind != "json_schema":
        return ResponseFormat(kind)
    described = _required(spec, "json_schema", param, _object)
    param = f"{param}.json_schema"
    name = _required(described, "name", param, _name)
    _optional(described, "description", param, _string)
    schema = _optional(described, "schema", param, _object)
    if schema is not None:
        try:
            check_schema(schema)
        except SchemaTooComplex as exc:
            raise response_schema_error(name, str(exc)) from None
    return ResponseFormat(
        kind,
        schema=schema,
        name=name,
        strict=_optional(described, "strict", param, _boolean) or False,
    )


def _tools(value: Any, param: str) -> list[Tool]:
    return _each(value, param, _tool, max_length=128)


def _tool(value: Any, param: str) -> Tool:
    tool = _object(value, param)
    _required(tool, "type", param, _FUNCTION)
    function = _required(tool, "function", param, _object)
    param = f"{param}.function"
    parsed = Tool(
        name=_required(function, "name", param, _name),
        description=_optional(function, "description", param, _string),
        parameters=_optional(function, "parameters", param, _object),
        strict=_optional(function, "strict", param, _boolean) or False,
    )
    if parsed.strict and parsed.parameters is not None:
        try:
            check_schema(parsed.parameters)
        except SchemaTooComplex as exc:
            raise tool_schema_error(f"{param}.parameters", parsed.name, str(exc)) from None
    return parsed


def _tool_choice(value: Any, param: str) -> ToolChoice:
    if isinstance(value, str):
        return ToolChoice(_enum(value, param, _TOOL_MODES))
    choice = _object(value, param, f"one of one of {_listing(_TOOL_MODES, 'or')} or object")
    function = _required(choice, "function", param, _object)
    name = _required(function, "name", f"{param}.function", _string)
    _required(choice, "type", param, _FUNCTION)
    return ToolChoice("function", name)


# Every key OpenAI accepts, with its parser; null always means "not given".
_PARAMETERS: dict[str, _Parser] = {
    "messages": _messages,
    "model": _string,
    "audio": _object,
    "frequency_penalty": partial(_decimal, lo=-2, hi=2),
    "function_call": _function_call,
    "functions": _array,
    "logit_bias": _logit_bias,
    "logprobs": _boolean,
    "max_completion_tokens": partial(_integer, lo=1),
    "max_tokens": partial(_integer, lo=1),
    "metadata": _metadata,
    "modalities": partial(_array, expected="an array of strings"),
    "n": partial(_integer, lo=1, hi=128),
    "parallel_tool_calls": _boolean,
    "prediction": _object,
    "presence_penalty": partial(_decimal, lo=-2, hi=2),
    "prompt_cache_key": _string,
    "reasoning_effort": partial(_enum, allowed=("none", "minimal", "low", "medium", "high")),
    "response_format": _response_format,
    "safety_identifier": _string,
    "seed": _integer,
    "service_tier": partial(_enum, allowed=("auto", "default", "flex", "scale", "priority")),
    "stop": _stop,
    "store": _boolean,
    "stream": _boolean,
    "stream_options": _stream_options,
    "temperature": partial(_decimal, lo=0, hi=2),
    "tool_choice": _tool_choice,
    "tools": _tools,
    "top_logprobs": partial(_integer, lo=0, hi=20),
    "top_p": partial(_decimal, lo=0, hi=1),
    "user": _string,
    "verbosity": partial(_enum, allowed=("low", "medium", "high")),
    "web_search_options": _object,
}

# Parameters that only make sense beside another one: (key, needed, error).
_ONLY_WITH = (
    (
        "stream_options",
        "stream",
        "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
    ),
    (
        "top_logprobs",
        "logprobs",
        "The 'top_logprobs' parameter is only allowed when 'logprobs' is enabled.",
    ),
    (
        "tool_choice",
        "tools",
        "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are"
        " specified.",
    ),
    (
        "parallel_tool_calls",
        "tools",
        "Invalid value for 'parallel_tool_calls': 'parallel_tool_calls' is only allowed when"
        " 'tools' are specified.",
    ),
)

# The parameters stored on ChatRequest under their own name.
_FIELDS = frozenset(each.name for each in fields(ChatRequest))


# Rules across parameters and messages.


def _resolve_tool_choice(choice: ToolChoice | None, tools: list[Tool]) -> ToolChoice:
    """The choice as sent, else OpenAI's default: auto with tools, none without."""
    if choice is None:
        return ToolChoice("auto" if tools else "none")
    if choice.name is not None and all(tool.name != choice.name for tool in tools):
        raise APIError(
            f"Invalid value for 'tool_choice': no function named '{choice.name}' was specified"
            " in the 'tools' parameter.",
            param="tool_choice",
        )
    return choice


def _check_conversation(messages: list[Message], sent: list[dict[str, Any]]) -> None:
    """Every message has content or calls, and tool results answer the calls just made."""
    calls: list[str] | None = None  # the ids the current run of tool messages may answer
    unanswered: list[str] = []
    for i, (message, raw) in enumerate(zip(messages, sent, strict=True)):
        where = f"messages.[{i}]"
        calling = message.role == "assistant" and (
            bool(message.tool_calls) or raw.get("function_call") is not None
        )
        if message.content is None and not calling:
            raise APIError(
                "Invalid value for 'content': expected a string, got null.",
                param=f"{where}.content",
            )
        if message.role == "tool":
            if calls is None:
                raise APIError(
                    "Invalid parameter: messages with role 'tool' must be a response to a"
                    " preceeding message with 'tool_calls'.",
                    param=f"{where}.role",
                )
            if message.tool_call_id not in calls:
                raise APIError(
                    f"Invalid parameter: 'tool_call_id' of '{message.tool_call_id}' not found in"
                    " 'tool_calls' of previous message.",
                    param=f"{where}.tool_call_id",
                )
            unanswered = [call for call in unanswered if call != message.tool_call_id]
            continue
        if unanswered:
            raise _unanswered(unanswered, f"{where}.role")
        calls = [call["id"] for call in message.tool_calls] if message.tool_calls else None
        unanswered = list(calls or ())
    if unanswered:
        raise _unanswered(unanswered, "messages")


def _unanswered(ids: list[str], param: str) -> APIError:
    return APIError(
        "An assistant message with 'tool_calls' must be followed by tool messages responding to"
        " each 'tool_call_id'. The following tool_call_ids did not have response messages:"
        f" {', '.join(ids)}",
        param=param,
    )


# JSON Schemas: bounded before anything (a grammar, an upstream request) is built from one.


@dataclass(frozen=True, slots=True)
class SchemaBounds:
    """Caps on the work one JSON Schema can cause.

    Counts are totals over the whole schema. A repetition is a count keyword
    (``minItems``, ``maxLength``, ...) or a ``{n,m}`` in a ``pattern``; grammar
    builders unroll each into that many copies of a rule.
    """

    max_bytes: int  # as compact JSON
    max_depth: int  # subschemas within subschemas
    max_properties: int
    max_enum_values: int
    max_branches: int  # members of anyOf, oneOf and allOf, and of type lists
    max_repetition: int
    max_pattern_length: int
    max_nested_repetition: int  # the product of {n,m} nested in a pattern's groups


SCHEMA_BOUNDS = SchemaBounds(
    max_bytes=256 * 1024,
    max_depth=32,
    max_properties=5000,  # OpenAI's limit for strict schemas
    max_enum_values=1000,  # OpenAI's limit for strict schemas
    max_branches=1000,
    max_repetition=100_000,  # a grammar unrolled from it stays within a few megabytes
    max_pattern_length=10_000,
    max_nested_repetition=100_000,
)
"""What any request's schemas may hold, whichever backend serves it; a backend
that builds more from a schema (the local model's grammars) bounds it further."""


class SchemaTooComplex(ValueError):
    """A schema beyond its :class:`SchemaBounds`; the message says where and how."""


def check_schema(schema: Any, bounds: SchemaBounds = SCHEMA_BOUNDS) -> None:
    """Raise :class:`SchemaTooComplex` if ``schema`` exceeds ``bounds``.

    Only the work a schema can cause is checked, without recursion; whether it
    is a valid schema is left to whoever uses it.
    """
    try:
        size = len(orjson.dumps(schema))
    except orjson.JSONEncodeError as exc:  # nested past orjson's 254 levels
        raise SchemaTooComplex(f"the schema cannot be encoded as JSON ({exc})") from None
    if size > bounds.max_bytes:
        raise SchemaTooComplex(
            f"the schema is {size} bytes long, more than the maximum of {bounds.max_bytes}"
        )
    limits = {
        "properties": bounds.max_properties,
        "enum values": bounds.max_enum_values,
        "anyOf, oneOf, allOf and type members": bounds.max_branches,
    }
    totals = dict.fromkeys(limits, 0)
    pending: list[tuple[Any, tuple[str, ...], int]] = [(schema, (), 0)]
    while pending:
        node, context, depth = pending.pop()
        if not isinstance(node, dict):
            continue
        if depth > bounds.max_depth:
            raise SchemaTooComplex(
                f"In context={context}, schemas nest more than {bounds.max_depth} levels deep"
            )
        for key in _REPETITIONS:
            count = node.get(key)
            if isinstance(count, int | float) and count > bounds.max_repetition:
                raise SchemaTooComplex(
                    f"In context={context}, '{key}' is {count}, more than the maximum of"
                    f" {bounds.max_repetition}"
                )
        if isinstance(pattern := node.get("pattern"), str):
            _check_pattern(pattern, context, bounds)
        for what, count in _counted(node):
            totals[what] += count
            if totals[what] > limits[what]:
                raise SchemaTooComplex(f"the schema has more than {limits[what]} {what}")
        pending.extend((child, (*context, *where), depth + 1) for where, child in _subschemas(node))


_REPETITIONS = (
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "minProperties",
    "maxProperties",
    "minContains",
    "maxContains",
)
_SUBSCHEMA = (
    "items",
    "additionalItems",
    "additionalProperties",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
)
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "dependentSchemas", "$defs", "definitions")


def _subschemas(node: dict[str, Any]) -> Iterator[tuple[tuple[str, ...], Any]]:
    """The schemas directly inside ``node``, each with its path from ``node``."""
    for key in _SUBSCHEMA:
        if isinstance(node.get(key), dict):
            yield (key,), node[key]
    for key in _SUBSCHEMA_LISTS:
        if isinstance(node.get(key), list):
            yield from (((key, str(i)), child) for i, child in enumerate(node[key]))
    for key in _SUBSCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            yield from (((key, name), child) for name, child in node[key].items())


def _counted(node: dict[str, Any]) -> Iterator[tuple[str, int]]:
    """What ``node`` itself adds to the totals :func:`check_schema` bounds."""
    if isinstance(node.get("properties"), dict):
        yield "properties", len(node["properties"])
    if isinstance(node.get("enum"), list):
        yield "enum values", len(node["enum"])
    for key in ("anyOf", "oneOf", "allOf", "type"):
        if isinstance(node.get(key), list):
            yield "anyOf, oneOf, allOf and type members", len(node[key])


# A {n}, {n,} or {n,m} quantifier, as grammar builders read one.
_QUANTIFIER = re.compile(r"\{\s*([0-9]*)\s*(?:,\s*([0-9]*)\s*)?\}")
_HUGE = 10**9  # stands for a count too long to convert: int() refuses 4,300 digits


def _check_pattern(pattern: str, context: tuple[str, ...], bounds: SchemaBounds) -> None:
    """Bound a ``pattern``'s length and its counted repetitions, alone and nested.

    A count nested in a counted group multiplies: ``([a-z]{0,20}){0,20}`` lets
    400 positions match at once, and a grammar sampler tries each for every
    token. ``*``, ``+`` and ``?`` do not multiply: each loops over one copy.
    """
    if len(pattern) > bounds.max_pattern_length:
        raise SchemaTooComplex(
            f"In context={context}, 'pattern' is {len(pattern)} characters long, more than the"
            f" maximum of {bounds.max_pattern_length}"
        )
    groups = [0]  # per open group: the largest product of counts inside it
    last = 0  # the product of counts inside the atom or group just read
    i = 0
    while i < len(pattern):
        char = pattern[i]
        quantifier = _QUANTIFIER.match(pattern, i) if char == "{" else None
        if quantifier:
            count = max(_count(bound) for bound in quantifier.groups())
            if count > bounds.max_repetition:
                raise SchemaTooComplex(
                    f"In context={context}, 'pattern' repeats more than the maximum of"
                    f" {bounds.max_repetition} times"
                )
            if last and count * last > bounds.max_nested_repetition:
                raise SchemaTooComplex(
                    f"In context={context}, 'pattern' nests repetitions of more than the"
                    f" maximum of {bounds.max_nested_repetition} times in all"
                )
            last = count * max(last, 1)
            groups[-1] = max(groups[-1], last)
            i = quantifier.end()
            continue
        if char == "(":
            groups.append(0)
        elif char == ")" and len(groups) > 1:
            last = groups.pop()
            groups[-1] = max(groups[-1], last)
        elif char not in "*+?":
            last = 0
            i = _atom_end(pattern, i) - 1
        i += 1


def _atom_end(pattern: str, start: int) -> int:
    """Where the atom at ``start`` ends: one character, an escape or a ``[...]`` class."""
    if pattern[start] == "\\":
        return start + 2
    if pattern[start] != "[":
        return start + 1
    i = start + 1
    while i < len(pattern) and pattern[i] != "]":
        i += 2 if pattern[i] == "\\" else 1
    return i + 1


def _count(digits: str | None) -> int:
    if not digits:
        return 0
    return int(digits) if len(digits) <= 9 else _HUGE


def response_schema_error(name: str, reason: str) -> APIError:
    """OpenAI's 400 for a ``response_format`` schema that cannot be used."""
    return APIError(
        f"Invalid schema for response_format '{name}': {reason}.",
        param="response_format.json_schema.schema",
        code="invalid_json_schema",
    )


def tool_schema_error(param: str, name: str, reason: str) -> APIError:
    """OpenAI's 400 for a function's ``parameters`` schema that cannot be used."""
    return APIError(
        f"Invalid schema for function '{name}': {reason}.",
        param=param,
        code="invalid_function_parameters",
    )
