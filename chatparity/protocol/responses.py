"""The Responses API request: OpenAI's schema, validated with OpenAI's errors, and
turned into the Chat Completions request every backend serves.

:data:`RESPONSES_REQUEST` is the schema, one table of
:mod:`~chatparity.protocol.schema` nodes: :func:`parse_responses_request`
validates with it and the OpenAPI document is generated from it. Input items
are kept in the shape ``GET /v1/responses/{id}/input_items`` lists them (each
with an id); :func:`as_chat_request` turns the instructions, the earlier
conversation and the input into the ``messages`` of an equivalent
``/v1/chat/completions`` body, so backends never know which endpoint asked.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal, get_args

from .breakpoints import cache_marked
from .enums import REASONING_EFFORTS, SERVICE_TIERS, TOOL_CHOICE_MODES, VERBOSITIES
from .errors import APIError, invalid_json
from .request import (
    CACHE_CONTROL,
    METADATA,
    PROMPT_CACHE_MEMBERS,
    PROMPT_CACHE_PARAMETERS,
    ChatRequest,
    SchemaTooComplex,
    check_schema,
    parse_chat_request,
    response_schema_error,
    tool_schema_error,
)
from .request import Limits as Limits
from .schema import (
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
    missing_parameter,
)

NewId = Callable[[str], str]
"""Makes a new id with the given prefix (``msg``, ``fc``): ``msg_0a1b...``."""

InputRole = Literal["user", "assistant", "system", "developer"]
INPUT_ROLES: tuple[InputRole, ...] = get_args(InputRole)

ItemType = Literal[
    "message",
    "function_call",
    "function_call_output",
    "reasoning",
    "item_reference",
    "file_search_call",
    "computer_call",
    "computer_call_output",
    "web_search_call",
    "image_generation_call",
    "code_interpreter_call",
    "local_shell_call",
    "local_shell_call_output",
    "mcp_list_tools",
    "mcp_approval_request",
    "mcp_approval_response",
    "mcp_call",
    "custom_tool_call",
    "custom_tool_call_output",
]
ITEM_TYPES: tuple[ItemType, ...] = get_args(ItemType)
"""Every input item type OpenAI knows; messages and function calls are served,
reasoning items (another model's thoughts) are passed over."""

InputPartType = Literal["input_text", "output_text", "refusal", "input_image", "input_file"]
INPUT_PART_TYPES: tuple[InputPartType, ...] = get_args(InputPartType)
"""Every content part type OpenAI takes in input; only text is served."""

ResponsesToolType = Literal[
    "function",
    "namespace",
    "file_search",
    "computer",
    "computer_use_preview",
    "web_search",
    "web_search_2025_08_26",
    "web_search_preview",
    "web_search_preview_2025_03_11",
    "mcp",
    "code_interpreter",
    "image_generation",
    "local_shell",
    "shell",
    "apply_patch",
    "custom",
    "tool_search",
    "programmatic_tool_calling",
]
RESPONSES_TOOL_TYPES: tuple[ResponsesToolType, ...] = get_args(ResponsesToolType)
"""Every tool type OpenAI knows. Function tools are served, and those of a namespace;
hosted tools are the serving alias's to run, pass on or refuse; the others (run by
the client on calls no backend makes) are refused."""

HostedToolType = Literal[
    "web_search",
    "web_search_2025_08_26",
    "web_search_preview",
    "web_search_preview_2025_03_11",
    "file_search",
    "code_interpreter",
    "image_generation",
    "mcp",
]
HOSTED_TOOL_TYPES: tuple[HostedToolType, ...] = get_args(HostedToolType)
"""The tools OpenAI runs itself, whose results come back in the answer: an upstream
that speaks the Responses API may run them; for other backends the alias's policy
(``CHATPARITY["HOSTED_TOOLS"]``) leaves them out or refuses them."""

Includable = Literal[
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "message.input_image.image_url",
    "message.output_text.logprobs",
    "reasoning.encrypted_content",
]
INCLUDABLES: tuple[Includable, ...] = get_args(Includable)

Truncation = Literal["auto", "disabled"]
TRUNCATIONS: tuple[Truncation, ...] = get_args(Truncation)

ReasoningSummary = Literal["auto", "concise", "detailed"]
REASONING_SUMMARIES: tuple[ReasoningSummary, ...] = get_args(ReasoningSummary)

ItemStatus = Literal["in_progress", "completed", "incomplete"]
ITEM_STATUSES: tuple[ItemStatus, ...] = get_args(ItemStatus)

MIN_OUTPUT_TOKENS = 16
"""OpenAI's smallest ``max_output_tokens``."""


MAX_NAME_LENGTH = 64
"""The longest function name OpenAI takes, in either API."""
NAMESPACE_SEPARATOR = "__"


@dataclass(frozen=True, slots=True)
class ToolNames:
    """The names backends know the functions of namespaces by, and back.

    A backend is offered one flat list of functions: a namespace's function is
    ``<namespace>__<name>``, unless that is longer than a function name may be or
    is already the name of another function of the request (a client's own
    function of that name, or another namespace's), when it is shortened and ends
    with ``_`` and a digest of both names (and a count, until it is free). A call
    of the model by a flat name is the namespace's function again: names are
    looked up, never split, so no name can be taken for another.
    """

    flat: dict[tuple[str, str], str] = field(default_factory=dict)
    """(namespace, name) -> the flat name a backend knows the function by."""
    nested: dict[str, tuple[str, str]] = field(default_factory=dict)
    """The inverse of :attr:`flat`."""

    @classmethod
    def of(cls, functions: Iterable[str], namespaces: Iterable[tuple[str, list[str]]]) -> ToolNames:
        """The flat names of the functions of ``namespaces`` (each its name and its
        functions' names) among top-level ``functions``."""
        names = cls()
        taken = set(functions)
        for namespace, members in namespaces:
            for name in members:
                if (namespace, name) not in names.flat:
                    flat = _free_name(namespace, name, taken)
                    taken.add(flat)
                    names.flat[namespace, name] = flat
                    names.nested[flat] = (namespace, name)
        return names

    def flat_name(self, namespace: str, name: str) -> str:
        """How a backend knows ``name`` of ``namespace``: an earlier call of a namespace
        this request does not offer keeps the plain joined name."""
        return self.flat.get((namespace, name)) or f"{namespace}{NAMESPACE_SEPARATOR}{name}"

    def called(self, flat_name: str) -> dict[str, str]:
        """The ``name`` (and ``namespace``, for a namespace's function) of a call a
        backend made by ``flat_name``."""
        nested = self.nested.get(flat_name)
        if nested is None:
            return {"name": flat_name}
        return {"name": nested[1], "namespace": nested[0]}


NO_NAMESPACES = ToolNames()


def _free_name(namespace: str, name: str, taken: set[str]) -> str:
    joined = f"{namespace}{NAMESPACE_SEPARATOR}{name}"
    if len(joined) <= MAX_NAME_LENGTH and joined not in taken:
        return joined
    digest = hashlib.sha256(f"{namespace}/{name}".encode()).hexdigest()[:8]
    suffixes = (f"_{digest}{count or ''}" for count in itertools.count())
    shortened = (joined[: MAX_NAME_LENGTH - len(suffix)] + suffix for suffix in suffixes)
    return next(flat for flat in shortened if flat not in taken)


@dataclass(frozen=True, slots=True)
class ResponsesRequest:
    """A validated ``POST /v1/responses`` request. ``body`` keeps the JSON object as sent."""

    model: str
    input: list[dict[str, Any]]
    """The input items, as ``input_items`` lists them: each with an id."""
    body: dict[str, Any]
    instructions: str | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    chat: dict[str, Any] = field(default_factory=dict)
    """The Chat Completions parameters this request asks for, but ``messages``."""
    settings: dict[str, Any] = field(default_factory=dict)
    """The request's settings as the response object repeats them."""
    names: ToolNames = NO_NAMESPACES
    """The flat names of the functions of the request's namespaces."""
    hosted_tools: tuple[dict[str, Any], ...] = ()
    """The hosted tools asked for (:data:`HOSTED_TOOL_TYPES`), as sent."""


# Errors, in OpenAI's words.


def unknown_parameter(keys: list[str]) -> APIError:
    """OpenAI's error for a body key the Responses API does not know (the first one)."""
    return APIError(f"Unknown parameter: '{keys[0]}'.", param=keys[0], code="unknown_parameter")


def previous_response_not_found(response_id: str) -> APIError:
    return APIError(
        f"Previous response with id '{response_id}' not found.",
        param="previous_response_id",
        code="previous_response_not_found",
    )


def response_not_found(response_id: str) -> APIError:
    """A response that is not stored, expired, or stored for another key (404)."""
    return APIError(f"Response with id '{response_id}' not found.", status=404)


def _no_tool_output(call_id: str) -> APIError:
    return APIError(f"No tool output found for function call {call_id}.", param="input")


def _no_tool_call(call_id: str) -> APIError:
    return APIError(
        f"No tool call found for function call output with call_id {call_id}.", param="input"
    )


def _unserved(what: str) -> Callable[[str, str], APIError]:
    def refuse(kind: str, param: str) -> APIError:
        return APIError(
            f"Invalid value: '{kind}'. {what} '{kind}' is not supported by this server.",
            param=param,
            code="unsupported_value",
        )

    return refuse


def hosted_tool_refused(request: ResponsesRequest) -> APIError:
    """The 400 for the first hosted tool ``request`` asks for, on a backend that cannot
    run it, as any tool this server does not serve is refused."""
    tools: list[dict[str, Any]] = request.settings["tools"]
    index = next(i for i, tool in enumerate(tools) if tool["type"] in HOSTED_TOOL_TYPES)
    return _unserved("Tool type")(tools[index]["type"], f"tools[{index}].type")


# The schema. Items are read into the shape input_items lists them in.

_NAME = String(max_length=64, pattern="^[a-zA-Z0-9_-]+$")
_TEXT = String(max_length=Limit("max_content_chars"))
_ITEM_STATUS = Enum(ITEM_STATUSES)


def _part(text_key: str, kind: str) -> Object:
    members: tuple[Member, ...] = (Member(text_key, _TEXT, REQUIRED),)
    if text_key == "text":  # a text part may carry Anthropic's cache marker
        members += (Member("cache_control", CACHE_CONTROL),)

    def build(part: dict[str, Any], path: str) -> dict[str, Any]:
        built = {"type": kind, "text": part[text_key]}
        if part.get("cache_control") is not None:
            built["cache_control"] = part["cache_control"]
        return built

    return Object(members, build=build, name=f"{kind.title().replace('_', '')}Part")


_PART = Tagged(
    "type",
    INPUT_PART_TYPES,
    {
        "input_text": _part("text", "input_text"),
        "output_text": _part("text", "output_text"),
        "refusal": _part("refusal", "refusal"),
    },
    refuse=_unserved("Content type"),
)
# At most as many parts in one content as messages in a conversation: a message of
# 240,000 empty parts costs nothing in tokens, and everything in its parse and storage.
_PARTS = Array(_PART, may_be_empty=True, max_length=Limit("max_messages"))
_CONTENT = OneOf(
    (_TEXT, _PARTS),
    description="A string, or text parts (input_text, output_text, refusal).",
)


def _parts(content: str | list[dict[str, Any]], role: str) -> list[dict[str, Any]]:
    """Content as parts: a string becomes one text part of the kind its role sends."""
    if isinstance(content, str):
        kind = "output_text" if role == "assistant" else "input_text"
        return [{"type": kind, "text": content}]
    return content


def _message_item(members: dict[str, Any], path: str) -> dict[str, Any]:
    role = members["role"]
    parts = [
        {**part, "annotations": []} if part["type"] == "output_text" else part
        for part in _parts(members["content"], role)
    ]
    return {
        "id": members["id"],
        "type": "message",
        "role": role,
        "status": members["status"] or "completed",
        "content": parts,
    }


def _call_item(members: dict[str, Any], path: str) -> dict[str, Any]:
    item = {
        "id": members["id"],
        "type": "function_call",
        "status": members["status"] or "completed",
        "call_id": members["call_id"],
        "name": members["name"],
        "arguments": members["arguments"],
    }
    if members["namespace"] is not None:
        item["namespace"] = members["namespace"]
    return item


def _output_item(members: dict[str, Any], path: str) -> dict[str, Any]:
    output = members["output"]
    return {
        "id": members["id"],
        "type": "function_call_output",
        "status": members["status"] or "completed",
        "call_id": members["call_id"],
        "output": output if isinstance(output, str) else _joined(output),
    }


def _item_of(kind: str, build: Callable[[dict[str, Any], str], Any], *members: Member) -> Object:
    return Object(
        (*members, Member("id", String()), Member("status", _ITEM_STATUS)),
        build=build,
        name=f"{kind}InputItem",
    )


_ITEMS = Tagged(
    "type",
    ITEM_TYPES,
    {
        "message": _item_of(
            "Message",
            _message_item,
            Member("role", Enum(INPUT_ROLES), REQUIRED),
            Member("content", _CONTENT, REQUIRED),
        ),
        "function_call": _item_of(
            "FunctionCall",
            _call_item,
            Member("call_id", String(), REQUIRED),
            Member("name", String(), REQUIRED),
            Member("arguments", String(), REQUIRED),
            Member("namespace", String(), description="The namespace of the function called."),
        ),
        "function_call_output": _item_of(
            "FunctionCallOutput",
            _output_item,
            Member("call_id", String(), REQUIRED),
            Member("output", OneOf((_TEXT, _PARTS)), REQUIRED),
        ),
        "reasoning": Object(
            build=lambda item, path: None,
            name="ReasoningInputItem",
            description="Another model's reasoning: passed over.",
        ),
    },
    refuse=_unserved("Item type"),
)


@dataclass(frozen=True, slots=True, eq=False)
class _Item(Node):
    """An input item; one without a ``type`` is a message, as OpenAI reads it."""

    items: Node
    expected: str = "an object"
    description: str | None = None

    def accepts(self, value: Any) -> bool:
        return isinstance(value, dict)

    def parse(self, value: Any, path: str) -> Any:
        if isinstance(value, dict) and "type" not in value:
            value = {"type": "message", **value}
        return self.items.parse(value, path)

    def schema(self, components: Components) -> Schema:
        return components.describe(self.items)


_INPUT = OneOf(
    (_TEXT, Array(_Item(_ITEMS), may_be_empty=True, max_length=Limit("max_messages"))),
    description="A user message as a string, or input items.",
)


def _function_tool(members: dict[str, Any], path: str) -> dict[str, Any]:
    tool = {
        "type": "function",
        "name": members["name"],
        "description": members["description"],
        "parameters": members["parameters"],
        "strict": True if members["strict"] is None else members["strict"],
    }
    if tool["strict"] and tool["parameters"] is not None:
        try:
            check_schema(tool["parameters"])
        except SchemaTooComplex as exc:
            raise tool_schema_error(f"{path}.parameters", tool["name"], str(exc)) from None
    return tool


_FUNCTION_TOOL = Object(
    (
        Member("name", _NAME, REQUIRED),
        Member("description", String()),
        Member("parameters", Object(description="A JSON Schema.")),
        Member("strict", Boolean(), description="Default true, as OpenAI's."),
    ),
    build=_function_tool,
    name="FunctionTool",
)
_NAMESPACE_TOOL = Object(
    (
        Member("name", _NAME, REQUIRED),
        Member("description", String(), REQUIRED),
        Member(
            "tools",
            Array(
                Tagged(
                    "type",
                    ("function", "custom"),
                    {"function": _FUNCTION_TOOL},
                    refuse=_unserved("Tool type"),
                ),
                max_length=128,
            ),
            REQUIRED,
        ),
    ),
    build=lambda members, path: {"type": "namespace", **members},
    name="NamespaceTool",
    description=(
        "Functions grouped under a name. Backends are offered them as functions named"
        " <namespace>__<name> (shortened with a digest when that is too long or taken);"
        " their calls come back as function_call items with the namespace."
    ),
)


def _hosted_tool(kind: str) -> Object:
    return Object(
        name="".join(word.title() for word in kind.split("_")) + "Tool",
        description=(
            "A tool OpenAI runs itself, taken as sent: passed to an upstream that speaks"
            " the Responses API, else left out or refused as the alias says."
        ),
    )


_TOOL = Tagged(
    "type",
    RESPONSES_TOOL_TYPES,
    {
        "function": _FUNCTION_TOOL,
        "namespace": _NAMESPACE_TOOL,
        **{kind: _hosted_tool(kind) for kind in HOSTED_TOOL_TYPES},
    },
    refuse=_unserved("Tool type"),
)
_TOOL_CHOICE = OneOf(
    (
        Enum(TOOL_CHOICE_MODES),
        Tagged(
            "type",
            ("function",),
            {
                "function": Object(
                    (Member("name", String(), REQUIRED),),
                    build=lambda choice, path: {"type": "function", "name": choice["name"]},
                )
            },
        ),
    ),
)


def _check_format_schema(spec: dict[str, Any], path: str) -> None:
    try:
        check_schema(spec["schema"])
    except SchemaTooComplex as exc:
        error = response_schema_error(spec["name"], str(exc))
        error.param = "text.format.schema"
        raise error from None


_FORMAT = Tagged(
    "type",
    ("text", "json_object", "json_schema"),
    {
        "text": Object(build=lambda spec, path: {"type": "text"}),
        "json_object": Object(build=lambda spec, path: {"type": "json_object"}),
        "json_schema": Object(
            (
                Member("name", _NAME, REQUIRED),
                Member("schema", Object(description="A JSON Schema."), REQUIRED),
                Member("description", String()),
                Member("strict", Boolean()),
            ),
            build=lambda spec, path: {
                "type": "json_schema",
                "name": spec["name"],
                "schema": spec["schema"],
                "description": spec["description"],
                "strict": spec["strict"] or False,
            },
        ),
    },
    name="TextFormat",
)
_TEXT_CONFIG = Object(
    (Member("format", _FORMAT), Member("verbosity", Enum(VERBOSITIES))),
    build=lambda text, path: {
        "format": text["format"] or {"type": "text"},
        "verbosity": text["verbosity"] or "medium",
    },
)


def _check_json_schema_format(text: dict[str, Any] | None) -> None:
    if text is not None and text["format"]["type"] == "json_schema":
        _check_format_schema(text["format"], "text.format")


RESPONSES_REQUEST = Parameters(
    (
        Member("model", String(), NOT_NULL, "A model id from GET /models."),
        Member("input", _INPUT),
        Member("instructions", _TEXT, description="A system message before the input."),
        Member("background", Boolean(), description="Only false: responses are not queued."),
        Member(
            "client_metadata",
            Map(String()),
            description="What the client says of itself (Codex sends it); not used.",
        ),
        Member("include", Array(Enum(INCLUDABLES), may_be_empty=True)),
        Member("max_output_tokens", Integer(MIN_OUTPUT_TOKENS)),
        Member("max_tool_calls", Integer(1)),
        Member("metadata", METADATA),
        Member("parallel_tool_calls", Boolean()),
        Member(
            "previous_response_id",
            String(),
            description="A stored response of the key (or its owner): its conversation goes first.",
        ),
        *PROMPT_CACHE_MEMBERS,
        Member(
            "reasoning",
            Object(
                (
                    Member("effort", Enum(REASONING_EFFORTS)),
                    Member("summary", Enum(REASONING_SUMMARIES)),
                    Member("generate_summary", Enum(REASONING_SUMMARIES)),
                )
            ),
        ),
        Member("safety_identifier", String()),
        Member("service_tier", Enum(SERVICE_TIERS)),
        Member("store", Boolean(), description="Default true: kept for GET and continuing."),
        Member("stream", Boolean()),
        Member("stream_options", Object((Member("include_obfuscation", Boolean()),))),
        Member("temperature", Number(0, 2)),
        Member("text", _TEXT_CONFIG),
        Member("tool_choice", _TOOL_CHOICE, description="A named function must be one of them."),
        Member("tools", Array(_TOOL, may_be_empty=True, max_length=128)),
        Member("top_p", Number(0, 1)),
        Member("truncation", Enum(TRUNCATIONS)),
        Member("user", String()),
    ),
    unknown=unknown_parameter,
    name="CreateResponse",
    description=(
        "OpenAI's Responses request. Unknown keys are a 400 (`unknown_parameter`); only"
        " function tools and text content are served."
    ),
)
"""Every parameter served, with its schema; null always means "not given"."""


@lru_cache(maxsize=16)
def responses_request(limits: Limits) -> Parameters:
    """:data:`RESPONSES_REQUEST` with the server's ``limits`` in it."""
    return RESPONSES_REQUEST.bind(limits)


def parse_responses_request(body: Any, limits: Limits, new_id: NewId) -> ResponsesRequest:
    """Validate a decoded JSON body; raise :class:`APIError` as OpenAI would. Input
    items without an id get one from ``new_id``."""
    if not isinstance(body, dict):
        raise invalid_json()
    given = responses_request(limits).read(body, "", {})
    _check_json_schema_format(given.get("text"))
    if given.get("background"):
        raise APIError(
            "Background responses are not supported by this server.",
            param="background",
            code="unsupported_value",
        )
    sent = given.get("input", [])
    items = [
        item if item["id"] else {**item, "id": new_id(_ID_PREFIX[item["type"]])}
        for item in ([_user(sent)] if isinstance(sent, str) else sent)
        if item is not None  # a reasoning item, passed over
    ]
    tools: list[dict[str, Any]] = given.get("tools", [])
    namespaces = [
        (tool["name"], [function["name"] for function in tool["tools"]])
        for tool in tools
        if tool["type"] == "namespace"
    ]
    names = (
        ToolNames.of((tool["name"] for tool in tools if tool["type"] == "function"), namespaces)
        if namespaces
        else NO_NAMESPACES
    )
    functions = _offered(tools, names)
    choice = given.get("tool_choice", "auto")
    if isinstance(choice, dict) and all(
        tool["type"] != "function" or tool["name"] != choice["name"] for tool in tools
    ):
        raise APIError(
            f"Tool choice '{choice['name']}' not found in 'tools' parameter.", param="tool_choice"
        )
    text = given.get("text", {"format": {"type": "text"}, "verbosity": "medium"})
    reasoning = given.get("reasoning") or {}
    return ResponsesRequest(
        model=given["model"],
        input=items,
        body=body,
        instructions=given.get("instructions"),
        stream=given.get("stream", False),
        store=given.get("store", True),
        previous_response_id=given.get("previous_response_id"),
        chat=_chat_parameters(given, functions, choice, text, reasoning),
        settings={
            "instructions": given.get("instructions"),
            "max_output_tokens": given.get("max_output_tokens"),
            "max_tool_calls": given.get("max_tool_calls"),
            "metadata": given.get("metadata", {}),
            "parallel_tool_calls": given.get("parallel_tool_calls", True),
            "previous_response_id": given.get("previous_response_id"),
            "prompt_cache_key": given.get("prompt_cache_key"),
            "reasoning": {
                "effort": reasoning.get("effort"),
                "summary": reasoning.get("summary") or reasoning.get("generate_summary"),
            },
            "safety_identifier": given.get("safety_identifier"),
            "service_tier": "default",
            "store": given.get("store", True),
            "temperature": given.get("temperature", 1.0),
            "text": text,
            "tool_choice": choice,
            "tools": tools,
            "top_p": given.get("top_p", 1.0),
            "truncation": given.get("truncation", "disabled"),
            "user": given.get("user"),
        },
        names=names,
        hosted_tools=tuple(tool for tool in tools if tool["type"] in HOSTED_TOOL_TYPES),
    )


def _offered(tools: list[dict[str, Any]], names: ToolNames) -> list[dict[str, Any]]:
    """The functions a backend is offered: the client's, and those of its namespaces
    by their flat names."""
    functions: list[dict[str, Any]] = []
    for tool in tools:
        if tool["type"] == "function":
            functions.append(tool)
        elif tool["type"] == "namespace":
            functions += [
                {**function, "name": names.flat[tool["name"], function["name"]]}
                for function in tool["tools"]
            ]
    return functions


_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}


def _user(text: str) -> dict[str, Any]:
    return {
        "id": None,
        "type": "message",
        "role": "user",
        "status": "completed",
        "content": [{"type": "input_text", "text": text}],
    }


def _chat_parameters(
    given: dict[str, Any],
    functions: list[dict[str, Any]],
    choice: str | dict[str, Any],
    text: dict[str, Any],
    reasoning: dict[str, Any],
) -> dict[str, Any]:
    """The Chat Completions parameters the Responses parameters ``given`` stand for,
    ``functions`` the functions offered."""
    chat: dict[str, Any] = {"model": given["model"], "stream": given.get("stream", False)}
    for name in ("temperature", "top_p", "user", "service_tier", *PROMPT_CACHE_PARAMETERS):
        if name in given:
            chat[name] = given[name]
    if "max_output_tokens" in given:
        # Not max_completion_tokens, which some upstreams (llama-cpp-python's server)
        # ignore; an upstream that refuses max_tokens speaks the Responses API natively.
        chat["max_tokens"] = given["max_output_tokens"]
    if reasoning.get("effort") is not None:
        chat["reasoning_effort"] = reasoning["effort"]
    if "verbosity" in (given.get("text") or {}):
        chat["verbosity"] = text["verbosity"]
    if functions:
        chat["tools"] = [
            {
                "type": "function",
                "function": {
                    key: tool[key]
                    for key in ("name", "description", "parameters", "strict")
                    if tool[key] is not None
                },
            }
            for tool in functions
        ]
        chat["parallel_tool_calls"] = given.get("parallel_tool_calls", True)
    if functions or choice not in ("auto", "none"):
        chat["tool_choice"] = (
            choice if isinstance(choice, str) else {"type": "function", "function": choice}
        )
    spec = text["format"]
    if spec["type"] == "json_schema":
        described = {key: spec[key] for key in ("name", "schema", "strict")}
        if spec["description"] is not None:
            described["description"] = spec["description"]
        chat["response_format"] = {"type": "json_schema", "json_schema": described}
    elif spec["type"] == "json_object":
        chat["response_format"] = {"type": "json_object"}
    return chat


# The conversation, as Chat Completions messages.


def _joined(parts: list[dict[str, Any]]) -> str:
    return "".join(part["text"] for part in parts)


def conversation(
    items: list[dict[str, Any]], names: ToolNames = NO_NAMESPACES, *, marked_from: int = 0
) -> list[dict[str, Any]]:
    """``items`` (input items and earlier output items, oldest first) as Chat Completions
    messages: a run of function calls is one assistant message with ``tool_calls``
    (the text message just before it, if any), each output a tool message; a call of
    a namespace's function by the flat name ``names`` give it. The text parts of the
    items from ``marked_from`` on keep their cache markers (those of earlier responses'
    items are not sent again). OpenAI's 400 for a call without its output or an output
    without its call."""
    messages: list[dict[str, Any]] = []
    unanswered: list[str] = []
    calling: dict[str, Any] | None = None  # the assistant message of the current run of calls
    for position, item in enumerate(items):
        kind = item["type"]
        if kind == "function_call":
            if calling is None:
                if unanswered:
                    raise _no_tool_output(unanswered[0])
                last = messages[-1] if messages else None
                if last is not None and last["role"] == "assistant" and "tool_calls" not in last:
                    calling = last
                else:
                    calling = {"role": "assistant", "content": None}
                    messages.append(calling)
                calling["tool_calls"] = []
            namespace = item.get("namespace")
            name = item["name"] if namespace is None else names.flat_name(namespace, item["name"])
            function = {"name": name, "arguments": item["arguments"]}
            calling["tool_calls"].append(
                {"id": item["call_id"], "type": "function", "function": function}
            )
            unanswered.append(item["call_id"])
            continue
        calling = None
        if kind == "function_call_output":
            if item["call_id"] not in unanswered:
                raise _no_tool_call(item["call_id"])
            unanswered.remove(item["call_id"])
            messages.append(
                {"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}
            )
            continue
        if unanswered:
            raise _no_tool_output(unanswered[0])
        parts = item["content"]
        marked = position >= marked_from and any("cache_control" in part for part in parts)
        messages.append(
            {
                "role": item["role"],
                "content": [{**part, "type": "text"} for part in parts]
                if marked
                else _joined(parts),
            }
        )
    if unanswered:
        raise _no_tool_output(unanswered[0])
    return messages


def as_chat_request(
    request: ResponsesRequest, history: list[dict[str, Any]], limits: Limits
) -> ChatRequest:
    """The Chat Completions request that serves ``request``, continuing ``history`` (the
    items of the responses before it, oldest first); OpenAI's 400 if there is nothing
    to answer, or the conversation breaks a rule."""
    messages = conversation([*history, *request.input], request.names, marked_from=len(history))
    if request.instructions is not None:
        messages.insert(0, {"role": "system", "content": request.instructions})
    if not messages:
        raise missing_parameter("input")
    if request.chat.get("response_format", {}).get("type") == "json_object" and not any(
        "json" in (message["content"] or "").lower() for message in messages
    ):
        raise APIError(
            "Response input messages must contain the word 'json' in some form to use"
            " 'text.format' of type 'json_object'.",
            param="input",
        )
    try:
        chat = parse_chat_request({**request.chat, "messages": messages}, limits)
    except APIError as error:
        if error.param is not None and error.param.startswith("messages"):
            # The conversation as a whole (earlier responses with it) is over a limit.
            error.param = "input"
        raise
    if request.hosted_tools:
        chat = dataclasses.replace(chat, hosted_tools=request.hosted_tools)
    if cache_marked(chat):
        chat = dataclasses.replace(chat, translated_markers=True)
    return chat
