"""The Chat Completions request: OpenAI's schema, validated with OpenAI's errors.

:data:`CHAT_COMPLETION_REQUEST` is the schema, one table of
:mod:`~chatparity.protocol.schema` nodes: :func:`parse_chat_request` validates
with it and the OpenAPI document is generated from it. The rules that span
several parameters or messages follow it, as code.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from functools import lru_cache
from typing import Any, Literal, get_args

import orjson

from .enums import (
    AUDIO_FORMATS,
    CONTENT_PART_TYPES,
    FUNCTION_CALL_MODES,
    MODALITIES,
    REASONING_EFFORTS,
    RESPONSE_FORMAT_TYPES,
    ROLES,
    SERVICE_TIERS,
    TOOL_CHOICE_MODES,
    TOOL_TYPES,
    VERBOSITIES,
    ReasoningEffort,
    ResponseFormatType,
    Role,
    ServiceTier,
    ToolChoiceMode,
)
from .errors import APIError, invalid_json
from .schema import (
    LATER,
    NOT_NULL,
    REQUIRED,
    Array,
    Boolean,
    Components,
    Enum,
    Excludes,
    Holds,
    Integer,
    Later,
    Limit,
    Map,
    Member,
    Nullable,
    Number,
    Object,
    OneOf,
    Parameters,
    Requires,
    Schema,
    String,
    Tagged,
    wrong_type,
)

CacheTTL = Literal["5m", "1h"]
CACHE_TTLS: tuple[CacheTTL, ...] = get_args(CacheTTL)
"""The lifetimes of an entry of Anthropic's prompt cache; a marker without one is 5m's."""


@dataclass(frozen=True, slots=True)
class TextPart:
    """A text part of a message's content, as sent, with the cache marker it carries:
    Anthropic's ``cache_control`` (OpenRouter's clients put it on chat parts)."""

    text: str
    cache_control: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Message:
    """One entry of ``messages``; array content is flattened to its text."""

    role: Role
    content: str | None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    """As sent: a call may carry a ``cache_control`` marker (a Messages client's)."""
    tool_call_id: str | None = None
    function_call: dict[str, Any] | None = None
    """An assistant's call in the deprecated shape: ``{name, arguments}``."""
    parts: tuple[TextPart, ...] = ()
    """Array content's parts, each with its marker (none for string content): an
    upstream that caches prompts is sent them as they came."""

    @property
    def calls(self) -> list[dict[str, Any]]:
        """The functions this message called, ``{name, arguments}`` each, in either shape."""
        called = [call["function"] for call in self.tool_calls or ()]
        return called if self.function_call is None else [*called, self.function_call]


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool = False
    cache_control: dict[str, Any] | None = None
    """Anthropic's cache marker: the prompt is cached up to this tool."""


@dataclass(frozen=True, slots=True)
class ToolChoice:
    mode: ToolChoiceMode | Literal["function"]
    name: str | None = None


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    type: ResponseFormatType
    schema: dict[str, Any] | None = None
    name: str | None = None
    strict: bool = False


@dataclass(frozen=True, slots=True)
class Limits:
    """The server's caps on a request's size, on top of OpenAI's schema; None is no cap."""

    max_messages: int | None = None
    max_content_chars: int | None = None  # per content string: a content or one text part
    max_inputs: int = 2048  # per embeddings request (OpenAI's cap)


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
    legacy_functions: bool = False
    """The client sent the deprecated ``functions`` (and no ``tools``): a call is
    answered as ``function_call``, finishing with ``function_call``."""
    reasoning_effort: ReasoningEffort | None = None
    service_tier: ServiceTier | None = None
    user: str | None = None
    hosted_tools: tuple[dict[str, Any], ...] = ()
    """Not in a chat body: the Responses API's hosted tools (``web_search``, ...) asked
    for, as sent, for an upstream that speaks that API to run."""
    cache_control: dict[str, Any] | None = None
    """Not in a chat body: a Messages request's own ``cache_control`` (Anthropic's
    automatic caching), for an upstream that speaks that API."""
    translated_markers: bool = False
    """Not the client's: the body's ``cache_control`` markers were written by the gateway
    from another API's request (Anthropic's blocks, Responses parts): an
    OpenAI-compatible upstream, which may refuse them, is sent none."""
    # Not the client's: what the serving alias lets an upstream receive beyond the
    # sampling and format parameters (ModelAlias.forwarded_params).
    forwarded_params: frozenset[str] = frozenset()
    completion_limit: int | None = None
    """Not the client's: the completion tokens a choice of a request that sets no
    ``max_tokens`` may use, as its admission reserved them (what a budget has left). An
    answer that reaches it ends with ``length``; it is never refused as too long."""

    def beside_body(self) -> dict[str, Any]:
        """What this request holds that no chat body does, to keep when its body is read
        again (with an alias's defaults)."""
        return {
            "hosted_tools": self.hosted_tools,
            "cache_control": self.cache_control,
            "translated_markers": self.translated_markers,
        }

    @property
    def most_completion_tokens(self) -> int | None:
        """The completion tokens a choice may use: ``max_tokens``, else
        ``completion_limit`` (None: as many as the context holds)."""
        return self.max_tokens if self.max_tokens is not None else self.completion_limit

    def tool_parameters_param(self, index: int) -> str:
        """Where the client sent the parameters of the ``index``-th tool, as an error's
        ``param`` names them."""
        if self.legacy_functions:
            return f"functions[{index}].parameters"
        return f"tools[{index}].function.parameters"


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


def parse_model(body: Any) -> str:
    """The model a decoded JSON body names, checked before anything else in it, as
    OpenAI does (an empty name is no name); its 400 if there is none."""
    if not isinstance(body, dict):
        raise invalid_json()
    model = body.get("model")
    if model is None or model == "":
        raise _no_model("model")
    if not isinstance(model, str):
        raise wrong_type("model", "a string", model)
    return model


def parse_chat_request(body: Any, limits: Limits = NO_LIMITS) -> ChatRequest:
    """Validate a decoded JSON body; raise :class:`APIError` as OpenAI would.

    The checks run in OpenAI's order: the model, the other required keys,
    unknown keys, each parameter's JSON types, bounds and values in the order
    the body lists them, then the table's rules in theirs (``modalities``
    without text, ``logprobs``' type, the parameters that need another, those
    that exclude one), then the values of ``logit_bias``, then the rules that
    span several parameters or messages. ``limits`` are enforced with the
    errors OpenAI gives for its own maximum lengths.
    """
    parse_model(body)
    given = chat_completion_request(limits).read(body, "", {})
    logit_bias = _token_biases(body["logit_bias"]) if "logit_bias" in given else {}

    tools: list[Tool] = given.get("tools", [])
    choice = _resolve_tool_choice(given.get("tool_choice"), tools, "tool_choice", "tools")
    functions: list[Tool] | None = given.get("functions")
    if functions:
        calling = _resolve_tool_choice(
            given.get("function_call"), functions, "function_call", "functions"
        )
        if "tool_choice" not in given:
            choice = calling
        tools = [*tools, *functions]
    messages: list[Message] = given["messages"]
    _check_conversation(messages)
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
        logit_bias=logit_bias,
        tools=tools,
        tool_choice=choice,
    )
    if functions and "tools" not in given:
        # A deprecated function_call carries one call.
        settings.update(legacy_functions=True, parallel_tool_calls=False)
    if isinstance(stop := given.get("stop"), str):
        settings["stop"] = [stop]
    return ChatRequest(**settings)


# The parameters stored on ChatRequest under their own name.
_FIELDS = frozenset(each.name for each in fields(ChatRequest))


# The schema. Members are read in the order declared; the builds make the
# dataclasses above from what was read.

_NAME = String(max_length=64, pattern="^[a-zA-Z0-9_-]+$")
"""A function, schema or participant name."""
_TOOL_TYPE = Enum(TOOL_TYPES)
_TEXT = String(max_length=Limit("max_content_chars"))
MAX_STOPS = 4
"""The most stop sequences a request may give, as OpenAI allows."""
MAX_STOP_CHARS = 512
"""The longest stop sequence (OpenAI documents no length; this is far past any marker
a client ends an answer with): a backend that looks for stops in what it generates
holds back up to this much text, and looks through it at each token."""
STOP = String(max_length=MAX_STOP_CHARS)


def _refused_part(role: Role) -> Callable[[str, str], APIError]:
    """How a part of a ``role`` message whose type is not served is refused (given the
    type and its path): an image outside a user's message as OpenAI refuses it for any
    model, any other part as a model without it is refused."""

    def refuse(kind: str, param: str) -> APIError:
        if kind == "image_url" and role != "user":
            message = param.rsplit(".content", 1)[0]
            return APIError(
                f"Invalid '{message}'. Image URLs are only allowed for messages with role"
                f" 'user', but this message with role '{role}' contains an image URL.",
                param=message,
                code="invalid_value",
            )
        return APIError(
            f"Invalid content type. {kind} is only supported by certain models.",
            param=param.replace("[", ".["),  # as OpenAI's semantic checks spell a path
        )

    return refuse


CACHE_CONTROL = Object(
    (Member("type", Enum(("ephemeral",)), REQUIRED), Member("ttl", Enum(CACHE_TTLS))),
    name="CacheControl",
    description=(
        "Anthropic's cache marker: the prompt up to here is cached (5 minutes, or the"
        " ttl), sent on to an upstream that speaks the Messages API."
    ),
)
"""A ``cache_control`` marker: on a chat part or tool (OpenRouter's form), a Responses
part, an Anthropic block, tool or request."""
_CACHE_CONTROL = Member("cache_control", CACHE_CONTROL)

_TEXT_PART = Object(
    (Member("text", _TEXT, REQUIRED), _CACHE_CONTROL),
    build=lambda part, path: TextPart(part["text"], part["cache_control"]),
    name="TextContentPart",
    description="Only text parts are served; other part types are a 400.",
)


def _content(role: Role) -> OneOf:
    """The content of a ``role`` message other than an assistant's."""
    return OneOf(
        (
            _TEXT,
            Array(
                Tagged("type", CONTENT_PART_TYPES, {"text": _TEXT_PART}, refuse=_refused_part(role))
            ),
        ),
        description="A string, or text parts whose texts are joined.",
    )


_ASSISTANT_CONTENT = OneOf(
    (
        _TEXT,
        Array(
            Tagged(
                "type",
                CONTENT_PART_TYPES,
                {
                    "text": _TEXT_PART,
                    "refusal": Object(
                        (Member("refusal", _TEXT, REQUIRED),),
                        build=lambda part, path: TextPart(part["refusal"]),
                        name="RefusalContentPart",
                    ),
                },
                refuse=_refused_part("assistant"),
            )
        ),
    ),
    description="A string, or text and refusal parts whose texts are joined.",
)


def _message(members: dict[str, Any], path: str) -> Message:
    content = members.get("content")
    parts: tuple[TextPart, ...] = ()
    if isinstance(content, list):
        parts = tuple(content)
        content = "".join(part.text for part in parts)
    return Message(
        members["role"],
        content,
        name=members.get("name"),
        tool_calls=members.get("tool_calls"),
        tool_call_id=members.get("tool_call_id"),
        function_call=members.get("function_call"),
        parts=parts,
    )


def _message_of(role: str, description: str, *members: Member) -> Object:
    return Object(members, build=_message, name=f"{role}Message", description=description)


def _instructions(role: Role) -> tuple[Member, ...]:
    """The content and name of a ``role`` message. Only the developer schema requires
    content; a null content in another role is a semantic error, reported once the whole
    body is well-formed (LATER)."""
    return (Member("content", _content(role), LATER), Member("name", _NAME))


TOOL_CALL = Object(
    (
        Member("id", String(), REQUIRED),
        Member("type", _TOOL_TYPE, REQUIRED),
        Member(
            "function",
            Object((Member("name", String(), REQUIRED), Member("arguments", String(), REQUIRED))),
            REQUIRED,
        ),
        _CACHE_CONTROL,
    ),
    name="ToolCall",
)
"""A function call an assistant made: in an earlier message, and in an answer."""
_MESSAGE = Tagged(
    "role",
    ROLES,
    {
        "system": _message_of("System", "Instructions.", *_instructions("system")),
        "developer": _message_of(
            "Developer",
            "Instructions.",
            Member("content", _content("developer"), REQUIRED),
            Member("name", _NAME),
        ),
        "user": _message_of("User", "The user's turn.", *_instructions("user")),
        "assistant": _message_of(
            "Assistant",
            "An earlier answer: content, calls, or both (not neither).",
            Member("content", _ASSISTANT_CONTENT),
            Member("name", _NAME),
            Member("refusal", String()),
            Member(
                "function_call",
                Object(
                    (Member("name", String(), REQUIRED), Member("arguments", String(), REQUIRED))
                ),
                description="Deprecated: see tool_calls.",
            ),
            Member("tool_calls", Array(TOOL_CALL)),
        ),
        "tool": _message_of(
            "Tool",
            "A tool's result; it answers a call of the assistant message just before.",
            *_instructions("tool"),
            Member("tool_call_id", String(), REQUIRED),
        ),
        "function": _message_of(
            "Function",
            "Deprecated: a function's result, which may be null.",
            Member("content", Nullable(_TEXT), REQUIRED),
            Member("name", _NAME, NOT_NULL),
        ),
    },
)


def _tool(function: dict[str, Any], path: str) -> Tool:
    tool = Tool(
        name=function["name"],
        description=function["description"],
        parameters=function["parameters"],
        strict=function["strict"] or False,
    )
    if tool.strict and tool.parameters is not None:
        try:
            check_schema(tool.parameters)
        except SchemaTooComplex as exc:
            raise tool_schema_error(f"{path}.parameters", tool.name, str(exc)) from None
    return tool


_FUNCTION_MEMBERS = (
    Member("name", _NAME, REQUIRED),
    Member("description", String()),
    Member("parameters", Object(description="A JSON Schema.")),
)
_TOOL = Object(
    (
        Member("type", _TOOL_TYPE, REQUIRED),
        Member(
            "function",
            Object((*_FUNCTION_MEMBERS, Member("strict", Boolean())), build=_tool),
            REQUIRED,
        ),
        _CACHE_CONTROL,
    ),
    build=lambda tool, path: (
        tool["function"]
        if tool["cache_control"] is None
        else dataclasses.replace(tool["function"], cache_control=tool["cache_control"])
    ),
    name="Tool",
)
_FUNCTION = Object(
    _FUNCTION_MEMBERS,
    build=lambda function, path: Tool(
        function["name"], function["description"], function["parameters"]
    ),
    name="Function",
    description="Deprecated: a function, as a tool is now declared.",
)
_TOOL_CHOICE = OneOf(
    (
        Enum(TOOL_CHOICE_MODES),  # made a ToolChoice by _resolve_tool_choice
        Object(
            (
                Member("function", Object((Member("name", String(), REQUIRED),)), REQUIRED),
                Member("type", _TOOL_TYPE, REQUIRED),
            ),
            build=lambda choice, path: ToolChoice("function", choice["function"]["name"]),
        ),
    ),
)


def _check_response_schema(json_schema: dict[str, Any], path: str) -> None:
    if json_schema["schema"] is not None:
        try:
            check_schema(json_schema["schema"])
        except SchemaTooComplex as exc:
            raise response_schema_error(json_schema["name"], str(exc)) from None


_RESPONSE_FORMAT = Tagged(
    "type",
    RESPONSE_FORMAT_TYPES,
    {
        "text": Object(build=lambda spec, path: ResponseFormat("text")),
        "json_object": Object(build=lambda spec, path: ResponseFormat("json_object")),
        "json_schema": Object(
            (
                Member(
                    "json_schema",
                    Object(
                        (
                            Member("name", _NAME, REQUIRED),
                            Member("description", String()),
                            Member("schema", Object(), check=_check_response_schema),
                            Member("strict", Boolean()),
                        ),
                        build=lambda described, path: ResponseFormat(
                            "json_schema",
                            schema=described["schema"],
                            name=described["name"],
                            strict=described["strict"] or False,
                        ),
                    ),
                    REQUIRED,
                ),
            ),
            build=lambda spec, path: spec["json_schema"],
        ),
    },
    name="ResponseFormat",
)


_TOKEN_ID = re.compile(r"[0-9]+")
MAX_TOKEN_ID = 2**31 - 1
"""The largest token id a ``logit_bias`` key may name (llama.cpp's are 32-bit)."""
MAX_BIAS = 100
"""A ``logit_bias`` value is from -MAX_BIAS to MAX_BIAS."""


@dataclass(frozen=True, slots=True, eq=False)
class _LogitBias(Map):
    """``logit_bias``: parsing checks its JSON types and size; its keys and values are
    checked by :func:`_token_biases` once every parameter has been, as OpenAI does.
    The document states them all."""

    def schema(self, components: Components) -> Schema:
        return {
            **super(_LogitBias, self).schema(components),
            "propertyNames": {"pattern": "^[0-9]+$"},
            "additionalProperties": {"type": "number", "minimum": -MAX_BIAS, "maximum": MAX_BIAS},
        }


def _token_biases(sent: dict[str, Any]) -> dict[int, float]:
    """``logit_bias`` as sent (its types checked) read as token ids and biases, in
    OpenAI's words: ``param`` is ``logit_bias`` itself, whichever entry is wrong."""
    biases = {}
    for key, bias in sent.items():
        if not _TOKEN_ID.fullmatch(key):
            raise APIError(
                f"Invalid key in 'logit_bias': {key}. You should only be submitting non-negative"
                " integers.",
                param="logit_bias",
            )
        # Measured before int(), which refuses more than 4,300 digits with a ValueError.
        digits = key.lstrip("0") or "0"
        if len(digits) > len(str(MAX_TOKEN_ID)) or int(digits) > MAX_TOKEN_ID:
            raise APIError(
                f"Invalid key in 'logit_bias': {key}. Token ids are at most {MAX_TOKEN_ID}.",
                param="logit_bias",
                code="invalid_value",
            )
        if not -MAX_BIAS <= bias <= MAX_BIAS:
            raise APIError(
                f"Logit bias value {float(bias)!r} is invalid or outside of range"
                f" [-{MAX_BIAS}, {MAX_BIAS}]",
                param="logit_bias",
            )
        biases[int(digits)] = float(bias)
    return biases


_PREDICTED_PART = Object(
    (Member("type", Enum(("text",)), REQUIRED), Member("text", String(), REQUIRED))
)
_PREDICTION = Object(
    (
        Member("type", Enum(("content",)), REQUIRED),
        Member("content", OneOf((String(), Array(_PREDICTED_PART))), REQUIRED),
    )
)


PROMPT_CACHE_MEMBERS = (
    Member(
        "prompt_cache_key",
        String(),
        description="Sent on to an OpenAI-compatible upstream: requests that share it share"
        " a cache.",
    ),
    Member(
        "prompt_cache_options",
        Object(
            (
                Member("mode", Enum(("implicit", "explicit"))),
                Member("ttl", Enum(("30m",))),
            )
        ),
        description="Sent on to an OpenAI-compatible upstream.",
    ),
    Member(
        "prompt_cache_retention",
        Enum(("in_memory", "24h")),
        description="Sent on to an OpenAI-compatible upstream (earlier models'"
        " prompt_cache_options).",
    ),
)
"""OpenAI's prompt cache parameters, the same in both its APIs."""
PROMPT_CACHE_PARAMETERS = tuple(member.name for member in PROMPT_CACHE_MEMBERS)

METADATA = Map(
    String(max_length=512), max_properties=16, max_key_length=64, expected="a metadata object"
)
"""OpenAI's metadata object: at most 16 keys of at most 64 characters, values of at most 512."""


def _no_model(param: str) -> APIError:
    return APIError("you must provide a model parameter")


_PENALTY = Number(-2, 2)

CHAT_COMPLETION_REQUEST = Parameters(
    (
        Member("model", String(), NOT_NULL, "A model id from GET /models.", missing=_no_model),
        Member("messages", Array(_MESSAGE, max_length=Limit("max_messages")), NOT_NULL),
        Member(
            "audio",
            Object(
                (
                    Member("format", Enum(AUDIO_FORMATS), REQUIRED),
                    Member(
                        "voice",
                        OneOf((String(), Object((Member("id", String(), REQUIRED),)))),
                        REQUIRED,
                    ),
                )
            ),
            description="Accepted; answers are text only.",
        ),
        Member("frequency_penalty", _PENALTY),
        Member(
            "function_call",
            OneOf(
                (
                    Enum(FUNCTION_CALL_MODES),  # made a ToolChoice by _resolve_tool_choice
                    Object(
                        (Member("name", String(), REQUIRED),),
                        build=lambda choice, path: ToolChoice("function", choice["name"]),
                    ),
                )
            ),
            description="Deprecated: see tool_choice. A named function must be one of them.",
        ),
        Member(
            "functions",
            Array(_FUNCTION, max_length=128),
            description="Deprecated: see tools. A call is answered as function_call.",
        ),
        Member(
            "logit_bias",
            _LogitBias(Number(), max_properties=1024),
            description="Token ids, as strings, mapped to a bias.",
        ),
        Member("logprobs", Boolean()),
        Member("max_completion_tokens", Integer(1)),
        Member("max_tokens", Integer(1), description="Deprecated: see max_completion_tokens."),
        Member("metadata", METADATA),
        Member("modalities", Array(Enum(MODALITIES)), description="Answers are text only."),
        Member("n", Integer(1, 128)),
        Member("parallel_tool_calls", Boolean()),
        Member("prediction", _PREDICTION, description="Accepted; not used to speed answers up."),
        Member("presence_penalty", _PENALTY),
        *PROMPT_CACHE_MEMBERS,
        Member("reasoning_effort", Enum(REASONING_EFFORTS)),
        Member("response_format", _RESPONSE_FORMAT),
        Member("safety_identifier", String()),
        Member("seed", Integer(-(2**63), 2**63 - 1)),  # a signed 64-bit integer
        Member("service_tier", Enum(SERVICE_TIERS)),
        Member("stop", OneOf((STOP, Array(STOP, max_length=MAX_STOPS, may_be_empty=True)))),
        Member("store", Boolean()),
        Member("stream", Boolean()),
        Member(
            "stream_options",
            Object(
                (Member("include_obfuscation", Boolean()), Member("include_usage", Boolean())),
                build=lambda options, path: options["include_usage"] or False,
            ),
        ),
        Member("temperature", Number(0, 2)),
        Member("tool_choice", _TOOL_CHOICE, description="A named function must be one of them."),
        Member("tools", Array(_TOOL, max_length=128)),
        Member("top_logprobs", Integer(0, 20)),
        Member("top_p", Number(0, 1)),
        Member("user", String()),
        Member("verbosity", Enum(VERBOSITIES)),
        Member("web_search_options", Object()),
    ),
    # In OpenAI's order: its checks of the values read, then the parameters that need
    # another, then those that exclude one.
    rules=(
        Holds(
            "modalities",
            lambda modalities: "text" in modalities,
            "Invalid value for 'modalities'. Only ['text'] and ['text', 'audio'] are supported.",
            "Audio only with text.",
        ),
        Later("logprobs"),
        Requires(
            "top_logprobs",
            "logprobs",
            "The 'top_logprobs' parameter is only allowed when 'logprobs' is enabled.",
        ),
        Requires(
            "stream_options",
            "stream",
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
        ),
        Requires(
            "tool_choice",
            "tools",
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are"
            " specified.",
        ),
        Requires(
            "parallel_tool_calls",
            "tools",
            "Invalid value for 'parallel_tool_calls': 'parallel_tool_calls' is only allowed when"
            " 'tools' are specified.",
        ),
        Requires(
            "function_call",
            "functions",
            "Invalid value for 'function_call': 'function_call' is only allowed when 'functions'"
            " are specified.",
        ),
        Requires(
            "metadata", "store", "The 'metadata' parameter is only allowed when 'store' is enabled."
        ),
        Excludes(
            "max_tokens",
            "max_completion_tokens",
            "Setting 'max_tokens' and 'max_completion_tokens' at the same time is not supported.",
        ),
    ),
    name="CreateChatCompletionRequest",
    description=(
        "OpenAI's Chat Completions request. Unknown keys are a 400"
        " (`Unrecognized request argument supplied`); a response_format of"
        " json_object needs the word 'json' in some message."
    ),
)
"""Every parameter OpenAI accepts, with its schema; null always means "not given"."""


@lru_cache(maxsize=16)
def chat_completion_request(limits: Limits) -> Parameters:
    """:data:`CHAT_COMPLETION_REQUEST` with the server's ``limits`` in it."""
    return CHAT_COMPLETION_REQUEST.bind(limits)


# Rules across parameters and messages.


def _resolve_tool_choice(
    choice: ToolChoiceMode | ToolChoice | None, tools: list[Tool], param: str, among: str
) -> ToolChoice:
    """The choice (parameter ``param``) as sent, else OpenAI's default: auto with tools,
    none without; a named function must be one of the tools (parameter ``among``)."""
    if choice is None:
        return ToolChoice("auto" if tools else "none")
    if isinstance(choice, str):
        return ToolChoice(choice)
    if all(tool.name != choice.name for tool in tools):
        raise APIError(
            f"Invalid value for '{param}': no function named '{choice.name}' was specified"
            f" in the '{among}' parameter.",
            param=param,
        )
    return choice


def _check_conversation(messages: list[Message]) -> None:
    """Every message has content or calls, and tool results answer the calls just made."""
    calls: list[str] | None = None  # the ids the current run of tool messages may answer
    unanswered: list[str] = []
    for i, message in enumerate(messages):
        where = f"messages.[{i}]"
        calling = message.role == "assistant" and (
            bool(message.tool_calls) or message.function_call is not None
        )
        if message.content is None and not calling and message.role != "function":
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


def with_defaults(defaults: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with ``defaults`` for the parameters it does not give, under either of
    their names: a default ``max_tokens`` gives way to a ``max_completion_tokens``."""
    merged = {**defaults, **body}
    for name, other in _SYNONYMS:
        if name in defaults and name not in body and body.get(other) is not None:
            del merged[name]
    return merged


# The parameters that set one thing, which a request may not give together.
_SYNONYMS = (("max_tokens", "max_completion_tokens"), ("max_completion_tokens", "max_tokens"))


# The deprecated functions, for servers that only know tools.


def functions_as_tools(body: dict[str, Any]) -> dict[str, Any]:
    """A valid request ``body`` with the deprecated functions in the shape of tools,
    which every OpenAI-compatible server knows (``body`` itself if it has none).

    ``functions`` join ``tools``, ``function_call`` becomes ``tool_choice`` (unless
    one is given), and with no ``tools`` sent parallel calls are off, as a
    ``function_call`` carries one. In ``messages`` an assistant's ``function_call``
    answered by the ``function`` message right after it become a tool call
    (``call_<i>``, ``i`` the assistant message's index) and its tool result; other
    deprecated messages stay as sent, since a tool call must be answered.
    """
    functions = body.get("functions")
    function_call = body.get("function_call")
    messages = _calls_as_tools(body["messages"])
    if functions is None and function_call is None and messages is body["messages"]:
        return body
    converted = {key: value for key, value in body.items() if key not in _FUNCTION_PARAMETERS}
    converted["messages"] = messages
    if functions:
        tools = [
            {
                "type": "function",
                "function": {k: v for k, v in function.items() if k in _FUNCTION_FIELDS},
            }
            for function in functions
        ]
        converted["tools"] = [*(body.get("tools") or ()), *tools]
        if body.get("tools") is None:
            converted["parallel_tool_calls"] = False
        if body.get("tool_choice") is None and function_call is not None:
            converted["tool_choice"] = (
                function_call
                if isinstance(function_call, str)
                else {"type": "function", "function": {"name": function_call["name"]}}
            )
    return converted


_FUNCTION_PARAMETERS = frozenset({"functions", "function_call"})
# What a function declares; anything else in one (a tool's "strict") does not apply.
_FUNCTION_FIELDS = frozenset(member.name for member in _FUNCTION.members)


def _calls_as_tools(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with each deprecated call answered right after as a tool call and
    its result (``messages`` itself if there is none)."""
    converted: list[dict[str, Any]] | None = None
    for i in range(len(messages) - 1):
        message, following = messages[i], messages[i + 1]
        called = message.get("function_call") if message["role"] == "assistant" else None
        if called is None or following["role"] != "function":
            continue
        if converted is None:
            converted = list(messages)
        call_id = f"call_{i}"
        assistant = {key: value for key, value in message.items() if key != "function_call"}
        assistant["tool_calls"] = [
            *(message.get("tool_calls") or ()),
            {"id": call_id, "type": "function", "function": called},
        ]
        converted[i] = assistant
        # A tool result is a string: a function's null result is an empty one.
        result = {"role": "tool", "tool_call_id": call_id, "content": following["content"] or ""}
        converted[i + 1] = result
    return messages if converted is None else converted


def without_cache_markers(body: dict[str, Any]) -> dict[str, Any]:
    """A valid request ``body`` without the ``cache_control`` markers of its messages'
    parts and calls and of its tools (``body`` itself has none changed); a content of
    one text part is its text, as it was before a marker made it a list."""
    messages = []
    for message in body["messages"]:
        content, calls = message.get("content"), message.get("tool_calls")
        if isinstance(content, list):
            parts = [_unmarked(part) for part in content]
            one = len(parts) == 1 and parts[0]["type"] == "text"
            message = {**message, "content": parts[0]["text"] if one else parts}
        if calls:
            message = {**message, "tool_calls": [_unmarked(call) for call in calls]}
        messages.append(message)
    unmarked = {**body, "messages": messages}
    if body.get("tools"):
        unmarked["tools"] = [_unmarked(tool) for tool in body["tools"]]
    return unmarked


def _unmarked(item: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in item.items() if key != "cache_control"}


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
