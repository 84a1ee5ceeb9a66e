"""Anthropic's Messages API request: its schema, its errors, and the Chat Completions
request every backend serves.

:data:`MESSAGES_REQUEST` (``POST /v1/messages``) and :data:`COUNT_TOKENS_REQUEST`
(``POST /v1/messages/count_tokens``) are tables of
:mod:`~chatparity.protocol.schema` nodes: :func:`parse_messages_request`
validates with them and the OpenAPI document is generated from them. The
conversation (``system``, then user and assistant turns of content blocks) is
turned into the ``messages`` of an equivalent ``/v1/chat/completions`` body,
which :func:`as_chat_request` parses, so backends never know which endpoint
asked. Errors go out in Anthropic's envelope (:func:`error_body`), with its
statuses and types (:func:`error_status`, :func:`error_type`).

What a gateway can and cannot honour (the written policy; :data:`IGNORED` and
:data:`REFUSED` name the parameters):

- Served: ``model``, ``messages`` (user, assistant and system turns; ``text``,
  ``tool_use`` and ``tool_result`` blocks, a result's ``tool_reference`` read as
  the tool's name), ``system``, ``max_tokens``, ``stop_sequences``, ``temperature``,
  ``top_p``, ``tools`` (custom tools: ``name``, ``description``,
  ``input_schema``, ``strict``), ``tool_choice`` (``auto``, ``any``, ``tool``,
  ``none``, ``disable_parallel_tool_use``), ``metadata.user_id`` (the chat
  request's ``user``), ``service_tier``, ``output_config.format`` (a JSON
  schema for the answer), ``stream``.
- Accepted and ignored, as hints a gateway cannot act on: ``thinking`` and
  ``output_config.effort`` (the alias decides how hard its model reasons),
  ``thinking`` and ``redacted_thinking`` blocks of earlier turns (another
  model's thoughts, passed over), ``top_k``, ``cache_control`` anywhere,
  ``citations`` of text blocks, ``context_management`` (the backend reads the
  whole conversation), ``container``, ``inference_geo``, ``speed``,
  ``diagnostics``, ``fallbacks`` and ``fallback_credit_token`` (fallbacks are
  the alias's), ``output_config.task_budget``, a tool's ``defer_loading``,
  ``eager_input_streaming``, ``input_examples``, ``allowed_callers`` and
  ``cache_control``; the ``anthropic-version`` and ``anthropic-beta`` headers
  (the features a beta unlocks are served, ignored or refused by the fields
  above).
- Refused with a 400 naming the field: ``image``, ``document``,
  ``search_result``, ``container_upload``, ``mid_conv_system`` (a system turn
  serves) and server-tool blocks (the models
  behind a gateway read text), server tools (``web_search_*``, ``bash_*``,
  ``code_execution_*``, ...: they run on Anthropic's servers), non-empty
  ``mcp_servers``, unknown body keys (as Anthropic refuses them).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, get_args

import orjson

from .breakpoints import MAX_BREAKPOINTS, cache_marked
from .errors import APIError, ContextLengthExceeded, invalid_json
from .ids import call_id_of
from .request import CACHE_CONTROL, MAX_STOPS, STOP, ChatRequest, Limits, parse_chat_request
from .schema import (
    ANYTHING,
    NOT_NULL,
    REQUIRED,
    Array,
    Boolean,
    Components,
    Enum,
    Integer,
    Limit,
    Map,
    Member,
    Node,
    Number,
    Object,
    OneOf,
    Parameters,
    Schema,
    String,
    Tagged,
    wrong_type,
)

Role = Literal["user", "assistant", "system"]
ROLES: tuple[Role, ...] = get_args(Role)
"""A ``system`` turn is instructions from there on (Claude Code sends its environment so)."""

BlockType = Literal[
    "text",
    "image",
    "document",
    "search_result",
    "thinking",
    "redacted_thinking",
    "tool_use",
    "tool_result",
    "server_tool_use",
    "web_search_tool_result",
    "web_fetch_tool_result",
    "code_execution_tool_result",
    "bash_code_execution_tool_result",
    "text_editor_code_execution_tool_result",
    "tool_search_tool_result",
    "container_upload",
    "mid_conv_system",
]
BLOCK_TYPES: tuple[BlockType, ...] = get_args(BlockType)
"""Every content block type Anthropic takes in ``messages``; text, tool use and tool
results are served, earlier thinking is passed over, the rest refused."""

ResultBlockType = Literal["text", "image", "search_result", "document", "tool_reference"]
RESULT_BLOCK_TYPES: tuple[ResultBlockType, ...] = get_args(ResultBlockType)
"""The block types of a ``tool_result``'s content; text and tool references are served."""

ToolChoiceType = Literal["auto", "any", "tool", "none"]
TOOL_CHOICE_TYPES: tuple[ToolChoiceType, ...] = get_args(ToolChoiceType)

ThinkingType = Literal["enabled", "disabled", "adaptive"]
THINKING_TYPES: tuple[ThinkingType, ...] = get_args(ThinkingType)

Effort = Literal["low", "medium", "high", "xhigh", "max"]
EFFORTS: tuple[Effort, ...] = get_args(Effort)

ServiceTier = Literal["auto", "standard_only"]
SERVICE_TIERS: tuple[ServiceTier, ...] = get_args(ServiceTier)

StopReason = Literal[
    "end_turn",
    "max_tokens",
    "stop_sequence",
    "tool_use",
    "pause_turn",
    "refusal",
    "model_context_window_exceeded",
]
STOP_REASONS: tuple[StopReason, ...] = get_args(StopReason)

MIN_THINKING_BUDGET = 1024
"""Anthropic's smallest ``thinking.budget_tokens``."""
MAX_TOOLS = 128
"""The most tools a request may declare: what every backend takes."""


@dataclass(frozen=True, slots=True)
class MessagesRequest:
    """A validated ``POST /v1/messages`` (or ``count_tokens``) request."""

    model: str
    chat: dict[str, Any]
    """The Chat Completions body that serves it: its conversation and parameters, its
    cache markers on its parts, calls and tools (OpenRouter's form)."""
    stream: bool = False
    cache_control: dict[str, Any] | None = None
    """The request's own marker: Anthropic's automatic caching."""


# Errors, in Anthropic's words and envelope.

ErrorType = Literal[
    "invalid_request_error",
    "authentication_error",
    "billing_error",
    "permission_error",
    "not_found_error",
    "request_too_large",
    "rate_limit_error",
    "timeout_error",
    "api_error",
    "overloaded_error",
]
ERROR_TYPES: tuple[ErrorType, ...] = get_args(ErrorType)

OVERLOADED = 529
"""Anthropic's status for a service too busy to answer now."""
_TYPE_BY_STATUS: dict[int, ErrorType] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    OVERLOADED: "overloaded_error",
}


def error_status(error: APIError) -> int:
    """The status Anthropic would answer ``error`` with: a gateway's 503 (something it
    needs is away for now) is Anthropic's 529, overloaded; others are kept."""
    return OVERLOADED if error.status == 503 else error.status


def error_type(status: int) -> ErrorType:
    """Anthropic's error type for ``status``."""
    kind = _TYPE_BY_STATUS.get(status)
    if kind is not None:
        return kind
    return "api_error" if status >= 500 else "invalid_request_error"


def error_message(error: APIError) -> str:
    """``error``'s message, in Anthropic's words where clients read them: Claude Code
    shortens ``max_tokens`` and retries on its context-limit message, and compacts the
    conversation on ``prompt is too long``."""
    if error.code != "context_length_exceeded":
        return error.message
    if not isinstance(error, ContextLengthExceeded):  # an upstream's: its numbers unknown
        return f"prompt is too long: {error.message}"
    limit, prompt, completion = error.limit, error.prompt_tokens, error.completion_tokens
    if completion and prompt < limit:
        return (
            f"input length and `max_tokens` exceed context limit: {prompt} + {completion} >"
            f" {limit}, decrease input length or `max_tokens` and try again"
        )
    return f"prompt is too long: {prompt} tokens > {limit} maximum"


def error_body(error: APIError, request_id: str) -> dict[str, Any]:
    """The JSON Anthropic sends for ``error``, as a body or an ``error`` event."""
    return {
        "type": "error",
        "error": {"type": error_type(error_status(error)), "message": error_message(error)},
        "request_id": request_id,
    }


def missing_api_key() -> APIError:
    return APIError("x-api-key header is required", status=401)


def not_found(path: str) -> APIError:
    return APIError(f"Not Found: {path}", status=404)


def extra_inputs(keys: list[str]) -> APIError:
    """Anthropic's error for a body key it does not know (the first one)."""
    return APIError(f"{keys[0]}: Extra inputs are not permitted", param=keys[0])


def dotted(path: str) -> str:
    """A value's path as Anthropic's errors spell it: ``messages.0.content.1``."""
    return re.sub(r"\[([0-9]+)\]", r".\1", path).lstrip(".")


def _refused(what: str) -> Callable[[str, str], APIError]:
    def refuse(kind: str, param: str) -> APIError:
        return APIError(
            f"{dotted(param)}: '{kind}' {what} are not supported by this server.",
            param=param,
            code="unsupported_value",
        )

    return refuse


# The schema. Content blocks are read into the small dicts the conversion takes.

_NAME = String(max_length=64, pattern="^[a-zA-Z0-9_-]+$")
_TEXT = String(max_length=Limit("max_content_chars"))
_TEXT_BLOCK = Object(
    (
        Member("text", _TEXT, REQUIRED),
        Member("cache_control", CACHE_CONTROL),
        Member("citations", Array(ANYTHING, may_be_empty=True), description="Ignored."),
    ),
    build=lambda block, path: {
        "type": "text",
        "text": block["text"],
        "cache_control": block["cache_control"],
    },
    name="TextBlock",
)
_TEXT_BLOCKS = Array(Tagged("type", ("text",), {"text": _TEXT_BLOCK}), may_be_empty=True)
_RESULT_CONTENT = OneOf(
    (
        _TEXT,
        Array(
            Tagged(
                "type",
                RESULT_BLOCK_TYPES,
                {
                    "text": _TEXT_BLOCK,
                    "tool_reference": Object(
                        (
                            Member("tool_name", String(), REQUIRED),
                            Member("cache_control", CACHE_CONTROL),
                        ),
                        build=lambda block, path: {"type": "text", "text": block["tool_name"]},
                        name="ToolReferenceBlock",
                        description="A tool found by a tool search: its name, as text.",
                    ),
                },
                refuse=_refused("content blocks"),
            ),
            may_be_empty=True,
        ),
    ),
    description="A string, or text blocks (and tool references, read as the tool's name).",
)


def _tool_result(block: dict[str, Any], path: str) -> dict[str, Any]:
    content = block["content"]
    if isinstance(content, list):
        content = "\n".join(part["text"] for part in content)
    return {
        "type": "tool_result",
        "tool_use_id": block["tool_use_id"],
        "content": content or "",
        "is_error": bool(block["is_error"]),
        "cache_control": block["cache_control"],
    }


_BLOCK = Tagged(
    "type",
    BLOCK_TYPES,
    {
        "text": _TEXT_BLOCK,
        "tool_use": Object(
            (
                Member("id", String(), REQUIRED),
                Member("name", String(), REQUIRED),
                Member("input", Map(), REQUIRED),
                Member("cache_control", CACHE_CONTROL),
                Member("caller", Object(), description="Ignored."),
            ),
            build=lambda block, path: {
                "type": "tool_use",
                "id": block["id"],
                "name": block["name"],
                "input": block["input"],
                "cache_control": block["cache_control"],
            },
            name="ToolUseBlock",
            description="A call an earlier assistant turn made.",
        ),
        "tool_result": Object(
            (
                Member("tool_use_id", String(), REQUIRED),
                Member("content", _RESULT_CONTENT),
                Member("is_error", Boolean()),
                Member("cache_control", CACHE_CONTROL),
            ),
            build=_tool_result,
            name="ToolResultBlock",
            description="A call's result: in the user turn right after the call.",
        ),
        "thinking": Object(
            (Member("thinking", String(), REQUIRED), Member("signature", String(), REQUIRED)),
            build=lambda block, path: None,
            name="ThinkingBlock",
            description="Earlier thinking: passed over.",
        ),
        "redacted_thinking": Object(
            (Member("data", String(), REQUIRED),),
            build=lambda block, path: None,
            name="RedactedThinkingBlock",
            description="Earlier thinking: passed over.",
        ),
    },
    refuse=_refused("content blocks"),
)


@dataclass(frozen=True, slots=True)
class _Turn:
    """One entry of ``messages``: its role and its blocks (thinking passed over)."""

    role: Role
    blocks: list[dict[str, Any]]
    path: str


def _turn(members: dict[str, Any], path: str) -> _Turn:
    content = members["content"]
    if isinstance(content, str):
        blocks = [{"type": "text", "text": content}]
    else:
        blocks = [block for block in content if block is not None]
    return _Turn(members["role"], blocks, path)


_MESSAGE = Object(
    (
        Member("role", Enum(ROLES), REQUIRED),
        Member(
            "content",
            OneOf((_TEXT, Array(_BLOCK, may_be_empty=True))),
            REQUIRED,
            "A string, or content blocks.",
        ),
    ),
    build=_turn,
    name="InputMessage",
)


def _function_tool(tool: dict[str, Any], path: str) -> dict[str, Any]:
    """A custom tool as a chat tool: a function whose parameters are its input schema."""
    function = {"name": tool["name"], "parameters": tool["input_schema"]}
    for key in ("description", "strict"):
        if tool[key] is not None:
            function[key] = tool[key]
    chat = {"type": "function", "function": function}
    if tool["cache_control"] is not None:
        chat["cache_control"] = tool["cache_control"]
    return chat


_CUSTOM_TOOL = Object(
    (
        Member("name", _NAME, REQUIRED),
        Member("description", String()),
        Member(
            "input_schema",
            Object(
                (Member("type", Enum(("object",)), REQUIRED),),
                description="A JSON Schema of an object.",
            ),
            REQUIRED,
        ),
        Member("strict", Boolean()),
        Member("cache_control", CACHE_CONTROL),
        Member("defer_loading", Boolean(), description="Ignored: every tool is offered."),
        Member("eager_input_streaming", Boolean(), description="Ignored."),
        Member("input_examples", Array(Map(), may_be_empty=True), description="Ignored."),
        Member("allowed_callers", Array(String(), may_be_empty=True), description="Ignored."),
    ),
    build=_function_tool,
    name="Tool",
)


@dataclass(frozen=True, slots=True, eq=False)
class _ToolNode(Node):
    """A tool: a custom one (``type`` absent, null or ``custom``) is served; any other
    type names a server tool, which runs on Anthropic's servers and is refused."""

    expected: str = "an object"
    description: str | None = "A custom tool; server tools are refused."

    def accepts(self, value: Any) -> bool:
        return isinstance(value, dict)

    def parse(self, value: Any, path: str) -> Any:
        if not isinstance(value, dict):
            raise wrong_type(path, self.expected, value)
        kind = value.get("type")
        if kind is None or kind == "custom":
            return _CUSTOM_TOOL.parse(value, path)
        if not isinstance(kind, str):
            raise wrong_type(f"{path}.type", "a string", kind)
        raise APIError(
            f"{dotted(path)}.type: '{kind}' tools run on Anthropic's servers and are not"
            " supported by this server.",
            param=f"{path}.type",
            code="unsupported_value",
        )

    def schema(self, components: Components) -> Schema:
        described = components.describe(_CUSTOM_TOOL)
        return {
            "allOf": [
                described,
                {"properties": {"type": {"enum": ["custom", None]}}},
            ]
        }


_DISABLE_PARALLEL = Member("disable_parallel_tool_use", Boolean())
_TOOL_CHOICE = Tagged(
    "type",
    TOOL_CHOICE_TYPES,
    {
        "auto": Object((_DISABLE_PARALLEL,), name="ToolChoiceAuto"),
        "any": Object((_DISABLE_PARALLEL,), name="ToolChoiceAny"),
        "tool": Object(
            (Member("name", String(), REQUIRED), _DISABLE_PARALLEL), name="ToolChoiceTool"
        ),
        "none": Object(name="ToolChoiceNone"),
    },
    name="ToolChoice",
)
_THINKING = Tagged(
    "type",
    THINKING_TYPES,
    {
        "enabled": Object(
            (
                Member("budget_tokens", Integer(MIN_THINKING_BUDGET), REQUIRED),
                Member("display", Enum(("summarized", "omitted"))),
            ),
            name="ThinkingEnabled",
        ),
        "disabled": Object(name="ThinkingDisabled"),
        "adaptive": Object(
            (Member("display", Enum(("summarized", "omitted"))),), name="ThinkingAdaptive"
        ),
    },
    name="ThinkingConfig",
    description="Accepted; how hard a model reasons is its alias's setting.",
)
_JSON_FORMAT = Object(
    (
        Member("type", Enum(("json_schema",)), REQUIRED),
        Member("schema", Object(description="A JSON Schema."), REQUIRED),
    ),
    name="JSONOutputFormat",
)
_OUTPUT_CONFIG = Object(
    (
        Member("effort", Enum(EFFORTS), description="Ignored: the alias's setting."),
        Member("format", _JSON_FORMAT, description="The answer is JSON of this schema."),
        Member("task_budget", Object(), description="Ignored."),
    ),
    name="OutputConfig",
)


def _ignored(description: str = "Accepted and ignored.") -> Object:
    return Object(description=description)


_MEMBERS = (
    Member("model", String(), NOT_NULL, "A model id from GET /models."),
    Member("messages", Array(_MESSAGE, max_length=Limit("max_messages")), NOT_NULL),
    Member("max_tokens", Integer(1), NOT_NULL),
    Member("cache_control", CACHE_CONTROL),
    Member("container", OneOf((String(), Object())), description="Accepted and ignored."),
    Member("context_management", _ignored("Accepted; the backend reads the whole conversation.")),
    Member("diagnostics", _ignored()),
    Member("fallback_credit_token", OneOf((String(), Object())), description="Ignored."),
    Member(
        "fallbacks",
        OneOf((Enum(("default",)), Array(ANYTHING, may_be_empty=True))),
        description="Ignored: an alias has its own fallbacks.",
    ),
    Member("inference_geo", String(), description="Ignored."),
    Member(
        "mcp_servers",
        Array(Object(), may_be_empty=True),
        description="Only empty: the gateway connects to no MCP server.",
    ),
    Member("metadata", Object((Member("user_id", String()),)), description="user_id is `user`."),
    Member("output_config", _OUTPUT_CONFIG),
    Member("output_format", _JSON_FORMAT, description="Deprecated: see output_config.format."),
    Member("service_tier", Enum(SERVICE_TIERS)),
    Member("speed", Enum(("standard", "fast")), description="Ignored."),
    Member("stop_sequences", Array(STOP, max_length=MAX_STOPS, may_be_empty=True)),
    Member("stream", Boolean()),
    Member("system", OneOf((_TEXT, _TEXT_BLOCKS)), description="A string, or text blocks."),
    Member("temperature", Number(0, 1)),
    Member("thinking", _THINKING),
    Member("tool_choice", _TOOL_CHOICE, description="A named tool must be one of them."),
    Member("tools", Array(_ToolNode(), max_length=MAX_TOOLS, may_be_empty=True)),
    Member("top_k", Integer(0), description="Accepted and ignored."),
    Member("top_p", Number(0, 1)),
)

IGNORED = frozenset(
    {
        "container",
        "context_management",
        "diagnostics",
        "fallback_credit_token",
        "fallbacks",
        "inference_geo",
        "speed",
        "thinking",
        "top_k",
    }
)
"""The parameters accepted and not acted on (see the module's policy)."""
REFUSED = frozenset({"mcp_servers"})
"""The parameters refused unless empty."""

MESSAGES_REQUEST = Parameters(
    _MEMBERS,
    unknown=extra_inputs,
    name="CreateMessageRequest",
    description=(
        "Anthropic's Messages request. Unknown keys are a 400 (`Extra inputs are not"
        " permitted`); text, tool use and tool results are served, images, documents and"
        " server tools refused."
    ),
)
"""Every parameter of ``POST /v1/messages``, with its schema; null means "not given"."""

_COUNTED = frozenset(
    {
        "model",
        "messages",
        "cache_control",
        "context_management",
        "mcp_servers",
        "output_config",
        "output_format",
        "system",
        "thinking",
        "tool_choice",
        "tools",
    }
)
COUNT_TOKENS_REQUEST = Parameters(
    tuple(member for member in _MEMBERS if member.name in _COUNTED),
    unknown=extra_inputs,
    name="CountMessageTokensRequest",
    description="What a Messages request would send the model, to be counted.",
)
"""Every parameter of ``POST /v1/messages/count_tokens``."""


@lru_cache(maxsize=16)
def messages_request(limits: Limits) -> Parameters:
    """:data:`MESSAGES_REQUEST` with the server's ``limits`` in it."""
    return MESSAGES_REQUEST.bind(limits)


@lru_cache(maxsize=16)
def count_tokens_request(limits: Limits) -> Parameters:
    """:data:`COUNT_TOKENS_REQUEST` with the server's ``limits`` in it."""
    return COUNT_TOKENS_REQUEST.bind(limits)


def parse_messages_request(body: Any, limits: Limits, *, counting: bool = False) -> MessagesRequest:
    """Validate a decoded JSON body (``counting``: a ``count_tokens`` one); raise
    :class:`APIError` (a 400, in Anthropic's words where its rules span fields)."""
    if not isinstance(body, dict):
        raise invalid_json()
    table = count_tokens_request(limits) if counting else messages_request(limits)
    given = table.read(body, "", {})
    _check_cache_markers(body)
    if given.get("mcp_servers"):
        raise APIError(
            "mcp_servers: MCP servers are not supported by this server.",
            param="mcp_servers",
            code="unsupported_value",
        )
    _check_thinking(given)
    tools: list[dict[str, Any]] = given.get("tools", [])
    chat: dict[str, Any] = {
        "model": given["model"],
        "messages": _chat_messages(given.get("system"), given["messages"]),
    }
    if not counting:
        chat["max_tokens"] = given["max_tokens"]
        chat["stream"] = given.get("stream", False)
    for name in ("temperature", "top_p"):
        if name in given:
            chat[name] = given[name]
    if given.get("stop_sequences"):
        chat["stop"] = given["stop_sequences"]
    user_id = (given.get("metadata") or {}).get("user_id")
    if user_id is not None:
        chat["user"] = user_id
    if "service_tier" in given:
        chat["service_tier"] = "auto" if given["service_tier"] == "auto" else "default"
    if tools:
        _check_unique_tools(tools)
        chat["tools"] = tools
    chat.update(_tool_choice(given.get("tool_choice"), tools))
    json_format = (given.get("output_config") or {}).get("format") or given.get("output_format")
    if json_format is not None:
        chat["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": json_format["schema"], "strict": True},
        }
    return MessagesRequest(
        model=given["model"],
        chat=chat,
        stream=bool(chat.get("stream")),
        cache_control=given.get("cache_control"),
    )


def as_chat_request(request: MessagesRequest, limits: Limits) -> ChatRequest:
    """The Chat Completions request that serves ``request``; a 400 if the conversation,
    once in chat messages, is over a limit of the server's."""
    chat = parse_chat_request(request.chat, limits)
    if not cache_marked(chat) and request.cache_control is None:
        return chat
    return dataclasses.replace(
        chat, cache_control=request.cache_control, translated_markers=cache_marked(chat)
    )


# Anthropic's rules for cache markers, in its words.


def _check_cache_markers(body: dict[str, Any]) -> None:
    """At most :data:`~.breakpoints.MAX_BREAKPOINTS` markers (the request's own counts
    unless the last block has one), each on a block that takes one, none of 1h after
    one of 5m in the order tools, system, messages; the body is well formed."""
    found: list[tuple[str, dict[str, Any]]] = []  # (where, marker), in Anthropic's order
    for i, tool in enumerate(body.get("tools") or ()):
        if tool.get("cache_control") is not None:
            found.append((f"tools[{i}]", tool["cache_control"]))
    system = body.get("system")
    for i, block in enumerate(system if isinstance(system, list) else ()):
        _check_marked_block(block, f"system[{i}]", found)
    last: dict[str, Any] = {}
    for i, message in enumerate(body["messages"]):
        content = message["content"]
        for j, block in enumerate(content if isinstance(content, list) else ()):
            _check_marked_block(block, f"messages[{i}].content[{j}]", found)
        last = content[-1] if isinstance(content, list) and content else {}
    count = len(found)
    if body.get("cache_control") is not None and last.get("cache_control") is None:
        count += 1
    if count > MAX_BREAKPOINTS:
        raise APIError(
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided."
            f" Found {count}."
        )
    short = False  # a 5m marker came before
    for where, marker in found:
        if marker.get("ttl") == "1h" and short:
            raise APIError(
                f"{dotted(where)}.cache_control.ttl: a ttl='1h' cache_control block must not"
                " come after a ttl='5m' cache_control block. Note that blocks are processed"
                " in the following order: `tools`, `system`, `messages`.",
                param=f"{where}.cache_control.ttl",
            )
        short = short or marker.get("ttl") != "1h"


def _check_marked_block(
    block: dict[str, Any], where: str, found: list[tuple[str, dict[str, Any]]]
) -> None:
    """Note ``block``'s marker in ``found``; Anthropic's 400 where it takes none: a
    thinking block, a block inside a tool result, an empty text block."""
    kind = block["type"]
    if kind in ("thinking", "redacted_thinking") and "cache_control" in block:
        raise APIError(
            f"{dotted(where)}.{kind}.cache_control: Extra inputs are not permitted",
            param=f"{where}.cache_control",
        )
    inner = block.get("content") if kind == "tool_result" else None
    for k, part in enumerate(inner if isinstance(inner, list) else ()):
        if part.get("cache_control") is not None:
            raise APIError(
                f"{dotted(where)}.tool_result.content.{k}.cache_control: cache_control may"
                " not be specified within `tool_result.content`. Instead, place it directly"
                " on `tool_result`",
                param=f"{where}.content[{k}].cache_control",
            )
    marker = block.get("cache_control")
    if marker is None:
        return
    if kind == "text" and not block["text"]:
        raise APIError(
            f"{dotted(where)}.text: cache_control cannot be set for empty text blocks",
            param=f"{where}.cache_control",
        )
    found.append((where, marker))


# Rules across fields, in Anthropic's words.


def _check_thinking(given: dict[str, Any]) -> None:
    thinking = given.get("thinking")
    if thinking is None or thinking["type"] != "enabled" or "max_tokens" not in given:
        return
    if given["max_tokens"] <= thinking["budget_tokens"]:
        raise APIError(
            "`max_tokens` must be greater than `thinking.budget_tokens`.",
            param="max_tokens",
        )


def _check_unique_tools(tools: list[dict[str, Any]]) -> None:
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        name = tool["function"]["name"]
        if name in seen:
            raise APIError(f"tools: Tool names must be unique: '{name}'.", param=f"tools[{i}]")
        seen.add(name)


def _tool_choice(choice: dict[str, Any] | None, tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat parameters ``tool_choice`` stands for (none without tools to choose)."""
    if choice is None:
        return {}
    kind = choice["type"]
    if kind != "none" and not tools:
        raise APIError(
            f"tool_choice: tool_choice.type '{kind}' requires tools to be given.",
            param="tool_choice",
        )
    if not tools:
        return {}
    if kind == "tool" and all(tool["function"]["name"] != choice["name"] for tool in tools):
        raise APIError(
            f"tool_choice.name: Tool '{choice['name']}' not found in tools.",
            param="tool_choice.name",
        )
    chat: dict[str, Any] = {
        "tool_choice": {"type": "function", "function": {"name": choice["name"]}}
        if kind == "tool"
        else {"auto": "auto", "any": "required", "none": "none"}[kind]
    }
    if choice.get("disable_parallel_tool_use"):
        chat["parallel_tool_calls"] = False
    return chat


def _merged(turns: list[_Turn]) -> Iterator[_Turn]:
    """Consecutive turns of one role as one turn, as Anthropic reads them; each keeps
    the path of its last message."""
    current: _Turn | None = None
    for turn in turns:
        if current is not None and current.role == turn.role:
            current = _Turn(turn.role, [*current.blocks, *turn.blocks], turn.path)
            continue
        if current is not None:
            yield current
        current = turn
    if current is not None:
        yield current


def _text(blocks: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Text blocks as a chat message's content: one string, or text parts (each with
    its cache marker, in OpenRouter's form)."""
    if len(blocks) == 1 and blocks[0].get("cache_control") is None:
        text: str = blocks[0]["text"]
        return text
    return [_marked({"type": "text", "text": block["text"]}, block) for block in blocks]


def _marked(chat: dict[str, Any], block: dict[str, Any]) -> dict[str, Any]:
    """``chat`` (a part, a call) with the cache marker of the ``block`` it stands for."""
    if block.get("cache_control") is not None:
        chat["cache_control"] = block["cache_control"]
    return chat


def _chat_messages(
    system: str | list[dict[str, Any]] | None, turns: list[_Turn]
) -> list[dict[str, Any]]:
    """``system`` and the turns as Chat Completions messages: an assistant's tool uses are
    its ``tool_calls``, the tool results of the user turn after it are tool messages
    (before the rest of that turn). A call without its result, or a result without its
    call, is Anthropic's 400."""
    messages: list[dict[str, Any]] = []
    if system:
        messages.append(
            {"role": "system", "content": system if isinstance(system, str) else _text(system)}
        )
    calls: list[str] = []  # the calls of the assistant turn just before
    calling: _Turn | None = None
    for turn in _merged(turns):
        if calls and turn.role != "user":  # only the next user turn may answer them
            raise _unanswered(calling, calls)
        if turn.role == "system":
            messages.append(_system(turn))
            continue
        if turn.role == "assistant":
            message, calls = _assistant(turn)
            calling = turn
            messages.append(message)
            continue
        results = [block for block in turn.blocks if block["type"] == "tool_result"]
        for block in results:
            if block["tool_use_id"] not in calls:
                raise APIError(
                    f"{dotted(turn.path)}.content: unexpected `tool_use_id` found in `tool_result`"
                    f" blocks: {block['tool_use_id']}. Each `tool_result` block must have a"
                    " corresponding `tool_use` block in the previous message.",
                    param=f"{turn.path}.content",
                )
            calls.remove(block["tool_use_id"])
            call = call_id_of(block["tool_use_id"])
            content = block["content"]
            if block["cache_control"] is not None:  # the result's marker, on its one part
                content = [_marked({"type": "text", "text": content}, block)]
            messages.append({"role": "tool", "tool_call_id": call, "content": content})
        if calls:
            raise _unanswered(calling, calls)
        _misplaced(turn, "tool_use", "assistant")
        rest = [block for block in turn.blocks if block["type"] == "text"]
        if rest or not results:
            messages.append({"role": "user", "content": _text(rest) if rest else ""})
    if calls:
        raise _unanswered(calling, calls)
    return messages


def _system(turn: _Turn) -> dict[str, Any]:
    """A system turn as a chat system message: text only."""
    for i, block in enumerate(turn.blocks):
        if block["type"] != "text":
            raise APIError(
                f"{dotted(turn.path)}.content.{i}: `system` messages may only hold text blocks.",
                param=f"{turn.path}.content[{i}]",
            )
    return {"role": "system", "content": _text(turn.blocks)}


def _assistant(turn: _Turn) -> tuple[dict[str, Any], list[str]]:
    """An assistant turn as a chat message, and the ids of the tools it called."""
    _misplaced(turn, "tool_result", "user")
    texts = [block for block in turn.blocks if block["type"] == "text"]
    uses = [block for block in turn.blocks if block["type"] == "tool_use"]
    message: dict[str, Any] = {"role": "assistant", "content": _text(texts) if texts else ""}
    if uses:
        ids = [use["id"] for use in uses]
        if len(set(ids)) < len(ids):
            raise APIError(
                f"{dotted(turn.path)}.content: `tool_use` ids must be unique.",
                param=f"{turn.path}.content",
            )
        message["tool_calls"] = [
            _marked(
                {
                    "id": call_id_of(use["id"]),
                    "type": "function",
                    "function": {
                        "name": use["name"],
                        "arguments": orjson.dumps(use["input"]).decode(),
                    },
                },
                use,
            )
            for use in uses
        ]
        return message, ids
    return message, []


def _misplaced(turn: _Turn, kind: str, role: Role) -> None:
    """Refuse a ``kind`` block in ``turn``: it belongs in ``role``'s turns only."""
    if any(block["type"] == kind for block in turn.blocks):
        raise APIError(
            f"{dotted(turn.path)}.content: `{kind}` blocks are only allowed in `{role}` messages.",
            param=f"{turn.path}.content",
        )


def _unanswered(turn: _Turn | None, ids: list[str]) -> APIError:
    where = dotted(turn.path) if turn is not None else "messages"
    return APIError(
        f"{where}: `tool_use` ids were found without `tool_result` blocks immediately after:"
        f" {', '.join(ids)}. Each `tool_use` block must have a corresponding `tool_result`"
        " block in the next message.",
        param=turn.path if turn is not None else "messages",
    )
