"""parse_messages_request and as_chat_request: Anthropic's Messages request, validated
in Anthropic's words, and the chat request that serves it; Anthropic's error envelope."""

import re

import pytest

from chatparity.protocol import errors
from chatparity.protocol.errors import APIError
from chatparity.protocol.ids import tool_use_id
from chatparity.protocol.messages import (
    IGNORED,
    MESSAGES_REQUEST,
    REFUSED,
    as_chat_request,
    error_body,
    error_status,
    parse_messages_request,
)
from chatparity.protocol.request import Limits, ResponseFormat, TextPart, Tool, ToolChoice
from chatparity.protocol.tokens import approximate_request_tokens, prompt_bound

NO_LIMITS = Limits()
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CALL = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"}
HI = [{"role": "user", "content": "Hi"}]


def parse(limits=NO_LIMITS, counting=False, **body):
    body = {"model": "claude-sonnet", "messages": HI, **body}
    if not counting:
        body.setdefault("max_tokens", 64)
    return parse_messages_request(body, limits, counting=counting)


def chat(limits=NO_LIMITS, **body):
    return as_chat_request(parse(limits, **body), limits)


def refused(**body):
    with pytest.raises(APIError) as caught:
        chat(**body)
    assert caught.value.status == 400
    return caught.value


def sent(request):
    """The chat messages as sent: roles and contents (and calls, tool results' ids)."""
    return [
        {
            key: value
            for key, value in (
                ("role", message.role),
                ("content", message.content),
                ("tool_calls", message.tool_calls),
                ("tool_call_id", message.tool_call_id),
            )
            if value is not None
        }
        for message in request.messages
    ]


# The conversation.


def test_a_string_content_is_one_user_message():
    request = chat()
    assert sent(request) == [{"role": "user", "content": "Hi"}]
    assert request.model == "claude-sonnet"
    assert request.max_tokens == 64


def test_system_as_a_string_or_text_blocks_goes_first():
    assert sent(chat(system="Be brief."))[0] == {"role": "system", "content": "Be brief."}
    blocks = [
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": " Be brief."},
    ]
    request = chat(system=blocks)
    assert request.messages[0].role == "system"
    assert request.messages[0].content == "You are Claude Code. Be brief."
    assert request.body["messages"][0]["content"] == [
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": " Be brief."},
    ], "an upstream gets the blocks as text parts, with their markers"


def test_a_tool_round_trip_is_an_assistant_call_and_a_tool_message():
    request = chat(
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [{"type": "text", "text": "Looking."}, CALL]},
            {"role": "user", "content": [RESULT]},
        ],
        tools=[WEATHER],
    )
    assert sent(request) == [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "content": "Sunny", "tool_call_id": "toolu_1"},
    ]


@pytest.mark.parametrize(
    ("use_id", "call_id"),
    [
        ("toolu_" + "x" * 24, "call_" + "x" * 24),  # the form this server hands out
        (tool_use_id("chatcmpl-tool-7"), "chatcmpl-tool-7"),  # a backend's of another form
        ("toolu_1", "toolu_1"),  # one the client made up
    ],
)
def test_a_tool_use_id_reaches_the_backend_as_the_call_id_it_stands_for(use_id, call_id):
    request = chat(
        messages=[
            *HI,
            {"role": "assistant", "content": [{**CALL, "id": use_id}]},
            {"role": "user", "content": [{**RESULT, "tool_use_id": use_id}]},
        ],
        tools=[WEATHER],
    )
    calling, result = request.messages[1:]
    assert [call["id"] for call in calling.tool_calls] == [call_id]
    assert result.tool_call_id == call_id


def test_tool_results_come_before_the_rest_of_their_user_turn():
    results = [
        {"type": "text", "text": "And tomorrow?"},
        {**RESULT, "content": [{"type": "text", "text": "Sunny"}, {"type": "text", "text": "22C"}]},
    ]
    request = chat(
        messages=[
            *HI,
            {"role": "assistant", "content": [CALL]},
            {"role": "user", "content": results},
        ],
        tools=[WEATHER],
    )
    assert [(m.role, m.content) for m in request.messages[2:]] == [
        ("tool", "Sunny\n22C"),
        ("user", "And tomorrow?"),
    ]


def test_an_error_result_and_an_empty_one_are_served():
    request = chat(
        messages=[
            *HI,
            {"role": "assistant", "content": [CALL, {**CALL, "id": "toolu_2"}]},
            {
                "role": "user",
                "content": [
                    {**RESULT, "is_error": True, "content": "<tool_use_error>No.</tool_use_error>"},
                    {"type": "tool_result", "tool_use_id": "toolu_2"},
                ],
            },
        ],
        tools=[WEATHER],
    )
    assert [m.content for m in request.messages[2:]] == ["<tool_use_error>No.</tool_use_error>", ""]


def test_earlier_thinking_is_passed_over():
    thinking = [
        {"type": "thinking", "thinking": "The user greets me.", "signature": "c2ln"},
        {"type": "redacted_thinking", "data": "ZW5j"},
        {"type": "text", "text": "Hello!"},
    ]
    request = chat(messages=[*HI, {"role": "assistant", "content": thinking}, *HI])
    assert sent(request)[1] == {"role": "assistant", "content": "Hello!"}


def test_a_system_turn_is_a_system_message_where_it_is():
    request = chat(
        messages=[*HI, {"role": "system", "content": [{"type": "text", "text": "Now be terse."}]}]
    )
    assert sent(request) == [
        {"role": "user", "content": "Hi"},
        {"role": "system", "content": "Now be terse."},
    ]


def test_a_tool_reference_in_a_result_is_the_tools_name():
    found = [{"type": "tool_reference", "tool_name": "get_weather"}]
    request = chat(
        messages=[
            *HI,
            {"role": "assistant", "content": [CALL]},
            {"role": "user", "content": [{**RESULT, "content": found}]},
        ],
        tools=[WEATHER],
    )
    assert request.messages[-1].content == "get_weather"


def test_consecutive_turns_of_one_role_are_one_turn():
    request = chat(
        messages=[
            {"role": "user", "content": "Hi"},
            {"role": "user", "content": [{"type": "text", "text": "there"}]},
            {"role": "assistant", "content": "Hello"},
        ]
    )
    assert request.body["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}],
        },
        {"role": "assistant", "content": "Hello"},
    ]


def test_an_assistant_turn_of_thinking_only_is_an_empty_answer():
    thinking = [{"type": "thinking", "thinking": "Hm.", "signature": ""}]
    assert sent(chat(messages=[*HI, {"role": "assistant", "content": thinking}]))[1] == {
        "role": "assistant",
        "content": "",
    }


# Parameters.


def test_sampling_and_stopping_are_the_chat_parameters():
    request = chat(temperature=0.5, top_p=0.9, stop_sequences=["END"], max_tokens=100, stream=True)
    assert (request.temperature, request.top_p, request.stop) == (0.5, 0.9, ["END"])
    assert request.max_tokens == 100
    assert request.stream


def test_tools_are_functions_whose_parameters_are_their_input_schema():
    request = chat(tools=[{**WEATHER, "strict": True, "cache_control": {"type": "ephemeral"}}])
    assert request.tools == [
        Tool(
            "get_weather",
            "The weather in a city.",
            WEATHER["input_schema"],
            strict=True,
            cache_control={"type": "ephemeral"},
        )
    ]
    assert request.tool_choice == ToolChoice("auto")
    assert request.parallel_tool_calls


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, ToolChoice("auto")),
        ({"type": "any"}, ToolChoice("required")),
        ({"type": "none"}, ToolChoice("none")),
        ({"type": "tool", "name": "get_weather"}, ToolChoice("function", "get_weather")),
    ],
)
def test_tool_choices(choice, expected):
    assert chat(tools=[WEATHER], tool_choice=choice).tool_choice == expected


def test_disabling_parallel_tool_use_allows_one_call():
    request = chat(tools=[WEATHER], tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert not request.parallel_tool_calls


def test_tool_choice_none_without_tools_is_no_tools():
    request = chat(tool_choice={"type": "none"})
    assert request.tools == []
    assert request.tool_choice == ToolChoice("none")


def test_metadata_user_id_is_the_user_and_service_tiers_map():
    request = chat(metadata={"user_id": "user_abc"}, service_tier="standard_only")
    assert request.user == "user_abc"
    assert request.service_tier == "default"
    assert chat(service_tier="auto").service_tier == "auto"


def test_an_output_format_is_a_json_schema_response_format():
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
    expected = ResponseFormat("json_schema", schema=schema, name="output", strict=True)
    config = {"format": {"type": "json_schema", "schema": schema}, "effort": "high"}
    assert chat(output_config=config).response_format == expected
    assert chat(output_format={"type": "json_schema", "schema": schema}).response_format == expected


def test_what_claude_code_sends_is_accepted():
    """The shape of Claude Code 2.1.328's first request in print mode."""
    body = {
        "system": [
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>Be careful.</system-reminder>"},
                    {"type": "text", "text": "Say hi", "cache_control": {"type": "ephemeral"}},
                ],
            },
            {
                "role": "system",
                "content": [
                    {
                        "type": "text",
                        "text": "# Environment",
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
            },
        ],
        "tools": [
            {
                **WEATHER,
                "input_schema": {
                    "$schema": "http://json-schema.org/draft-07/schema#",
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                    "additionalProperties": False,
                },
            },
            {
                "name": "DeferredToolPlaceholder",
                "description": "Keeps deferred tool loading active.",
                "input_schema": {"type": "object", "properties": {}},
                "defer_loading": True,
            },
        ],
        "metadata": {"user_id": '{"device_id":"cbc1","account_uuid":"","session_id":"0317"}'},
        "max_tokens": 128000,
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "medium"},
        "stream": True,
        "temperature": 1,
    }
    request = chat(**body)
    assert request.messages[0].content == "You are Claude Code."
    assert request.messages[1].content == "<system-reminder>Be careful.</system-reminder>Say hi"
    assert (request.messages[2].role, request.messages[2].content) == ("system", "# Environment")
    assert request.reasoning_effort is None, "thinking is the alias's to set"
    assert request.stream
    assert request.max_tokens == 128000
    assert [tool.name for tool in request.tools] == ["get_weather", "DeferredToolPlaceholder"]


def test_parameters_accepted_and_ignored_are_not_sent_on():
    request = chat(
        top_k=5,
        container="container_1",
        inference_geo="us",
        speed="fast",
        diagnostics={},
        fallbacks="default",
        fallback_credit_token="tok",
        mcp_servers=[],
        thinking={"type": "enabled", "budget_tokens": 1024},
        max_tokens=2048,
    )
    assert set(request.body) == {"model", "messages", "max_tokens", "stream"}


def test_the_written_policy_names_only_parameters_of_the_table():
    names = {member.name for member in MESSAGES_REQUEST.members}
    assert names >= IGNORED
    assert names >= REFUSED


def test_counting_tokens_takes_no_max_tokens_and_refuses_it():
    request = as_chat_request(parse(counting=True, system="Be brief."), NO_LIMITS)
    assert request.max_tokens is None
    assert [m.role for m in request.messages] == ["system", "user"]
    with pytest.raises(APIError, match="max_tokens: Extra inputs are not permitted"):
        parse(counting=True, max_tokens=5)


# Refusals.


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"max_tokens": None}, "Missing required parameter: 'max_tokens'."),
        ({"messages": []}, "Invalid 'messages': empty array."),
        ({"system_prompt": "x"}, "system_prompt: Extra inputs are not permitted"),
        ({"temperature": 1.5}, "Invalid 'temperature': decimal above maximum value."),
        ({"messages": [{"role": "tool", "content": "x"}]}, "Invalid value: 'tool'."),
        (
            {"stop_sequences": ["a", "b", "c", "d", "e"]},
            "Invalid 'stop_sequences': array too long.",
        ),
        (
            {"stop_sequences": ["x" * 1_000_000]},
            "Invalid 'stop_sequences[0]': string too long.",
        ),
        ({"max_tokens": 0}, "Invalid 'max_tokens': integer below minimum value."),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 512}},
            "Invalid 'thinking.budget_tokens': integer below minimum value.",
        ),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 2048}, "max_tokens": 2048},
            "`max_tokens` must be greater than `thinking.budget_tokens`.",
        ),
        (
            {"mcp_servers": [{"type": "url", "url": "https://mcp.example", "name": "x"}]},
            "mcp_servers: MCP servers are not supported by this server.",
        ),
        (
            {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            "tools.0.type: 'web_search_20250305' tools run on Anthropic's servers and are not"
            " supported by this server.",
        ),
        ({"tools": [{"name": "x"}]}, "Missing required parameter: 'tools[0].input_schema'."),
        (
            {"tools": [{"name": "x", "input_schema": {"type": "string"}}]},
            "Invalid value: 'string'.",
        ),
        ({"tools": [WEATHER, WEATHER]}, "tools: Tool names must be unique: 'get_weather'."),
        ({"tool_choice": {"type": "any"}}, "tool_choice: tool_choice.type 'any' requires tools"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "get_time"}},
            "tool_choice.name: Tool 'get_time' not found in tools.",
        ),
    ],
)
def test_invalid_parameters_are_refused(body, message):
    assert refused(**body).message.startswith(message)


def test_images_and_documents_are_refused_where_they_are():
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "x"}}
    error = refused(messages=[{"role": "user", "content": [{"type": "text", "text": "?"}, image]}])
    assert error.message == (
        "messages.0.content.1.type: 'image' content blocks are not supported by this server."
    )
    document = {"type": "document", "source": {"type": "text", "data": "x"}}
    error = refused(
        messages=[
            *HI,
            {"role": "assistant", "content": [CALL]},
            {"role": "user", "content": [{**RESULT, "content": [document]}]},
        ],
        tools=[WEATHER],
    )
    assert error.message.startswith("messages.2.content.0.content.0.type: 'document'")


def test_a_call_must_be_answered_in_the_next_turn():
    error = refused(messages=[*HI, {"role": "assistant", "content": [CALL]}, *HI], tools=[WEATHER])
    assert error.message == (
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after:"
        " toolu_1. Each `tool_use` block must have a corresponding `tool_result` block in the"
        " next message."
    )
    last = refused(messages=[*HI, {"role": "assistant", "content": [CALL]}], tools=[WEATHER])
    assert last.message.startswith("messages.1: `tool_use` ids were found without")


def test_a_result_must_answer_a_call_of_the_turn_before():
    error = refused(messages=[{"role": "user", "content": [RESULT]}])
    assert error.message.startswith(
        "messages.0.content: unexpected `tool_use_id` found in `tool_result` blocks: toolu_1."
    )


def test_calls_belong_to_the_assistant_and_results_to_the_user():
    assert refused(messages=[{"role": "user", "content": [CALL]}]).message == (
        "messages.0.content: `tool_use` blocks are only allowed in `assistant` messages."
    )
    error = refused(messages=[*HI, {"role": "assistant", "content": [RESULT]}])
    assert error.message.startswith("messages.1.content: `tool_result` blocks are only allowed")


def test_a_system_turn_holds_text_and_answers_no_call():
    error = refused(messages=[*HI, {"role": "system", "content": [CALL]}])
    assert error.message == "messages.1.content.0: `system` messages may only hold text blocks."
    between = [
        *HI,
        {"role": "assistant", "content": [CALL]},
        {"role": "system", "content": "Careful."},
        {"role": "user", "content": [RESULT]},
    ]
    assert refused(messages=between, tools=[WEATHER]).message.startswith(
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after"
    )


def test_call_ids_are_unique():
    calls = {"role": "assistant", "content": [CALL, CALL]}
    error = refused(messages=[*HI, calls, {"role": "user", "content": [RESULT]}], tools=[WEATHER])
    assert error.message == "messages.1.content: `tool_use` ids must be unique."


def test_the_servers_limits_apply():
    limits = Limits(max_messages=2, max_content_chars=5)
    with pytest.raises(APIError, match="Invalid 'messages': array too long"):
        parse(limits, messages=HI * 3)
    with pytest.raises(APIError, match=r"Invalid 'messages\[0\].content': string too long"):
        parse(limits, messages=[{"role": "user", "content": "Hello, world"}])
    with pytest.raises(APIError, match="Invalid 'messages': array too long"):
        # The system prompt is a chat message too.
        chat(limits, system="Hi", messages=[*HI, {"role": "assistant", "content": "Hi"}])


def test_a_body_that_is_not_an_object_is_invalid_json():
    with pytest.raises(APIError, match="We could not parse the JSON body"):
        parse_messages_request([], NO_LIMITS)


# Anthropic's error envelope.


@pytest.mark.parametrize(
    ("error", "status", "kind"),
    [
        (APIError("bad"), 400, "invalid_request_error"),
        (errors.invalid_api_key("sk-abcdefghijkl"), 401, "authentication_error"),
        (APIError("no", status=403), 403, "permission_error"),
        (errors.model_not_found("x"), 404, "not_found_error"),
        (errors.request_too_large(10), 413, "request_too_large"),
        (APIError("slow down", status=429, type="requests"), 429, "rate_limit_error"),
        (errors.server_error(), 500, "api_error"),
        (APIError("upstream", status=502, type="server_error"), 502, "api_error"),
        (errors.service_unavailable("away"), 529, "overloaded_error"),
        (errors.timed_out("late"), 504, "timeout_error"),
    ],
)
def test_errors_take_anthropics_status_and_type(error, status, kind):
    assert error_status(error) == status
    assert error_body(error, "req_1") == {
        "type": "error",
        "error": {"type": kind, "message": error.message},
        "request_id": "req_1",
    }


def test_context_length_errors_are_worded_as_claude_code_reads_them():
    asked = errors.context_length_exceeded(2048, 1500, 32000)
    assert error_body(asked, "r")["error"]["message"] == (
        "input length and `max_tokens` exceed context limit: 1500 + 32000 > 2048, decrease input"
        " length or `max_tokens` and try again"
    )
    too_long = errors.context_length_exceeded(2048, 3000, None)
    assert (
        error_body(too_long, "r")["error"]["message"]
        == "prompt is too long: 3000 tokens > 2048 maximum"
    )
    upstreams = APIError("The upstream model returned an error.", code="context_length_exceeded")
    assert error_body(upstreams, "r")["error"]["message"].startswith("prompt is too long: ")


# Prompt caching: markers carried to the chat request, refused where Anthropic refuses them.

MARK = {"type": "ephemeral"}
HOUR = {"type": "ephemeral", "ttl": "1h"}


def text(words, marker=None):
    block = {"type": "text", "text": words}
    return block if marker is None else {**block, "cache_control": marker}


def test_markers_ride_on_the_chat_requests_parts_calls_and_tools():
    request = chat(
        cache_control=MARK,
        system=[text("Rules.", HOUR)],
        tools=[{**WEATHER, "cache_control": HOUR}],
        messages=[
            {"role": "user", "content": [text("Weather?")]},
            {"role": "assistant", "content": [{**CALL, "cache_control": MARK}]},
            {"role": "user", "content": [{**RESULT, "cache_control": MARK}]},
        ],
    )
    system, user, assistant, tool = request.messages
    assert system.parts == (TextPart("Rules.", HOUR),)
    assert (user.parts, user.content) == ((), "Weather?"), "an unmarked block stays a string"
    assert assistant.tool_calls[0]["cache_control"] == MARK
    assert tool.parts == (TextPart("Sunny", MARK),), "the result's marker, on its one part"
    assert request.tools[0].cache_control == HOUR
    assert request.cache_control == MARK
    assert request.translated_markers, "an OpenAI-compatible upstream is sent none of them"


def test_a_request_without_markers_is_as_before():
    request = chat(system=[text("Rules.")])
    assert (request.cache_control, request.translated_markers) == (None, False)
    assert request.messages[0].parts == ()


def test_counting_a_request_with_markers_gives_the_same_count():
    """Markers change no count, as Anthropic counts."""
    bare = {
        "system": [text("Rules of the house.")],
        "tools": [WEATHER],
        "messages": [{"role": "user", "content": [text("Weather?"), text("In Paris.")]}],
    }
    marked = {
        "system": [text("Rules of the house.", HOUR)],
        "tools": [{**WEATHER, "cache_control": HOUR}],
        "messages": [{"role": "user", "content": [text("Weather?"), text("In Paris.", MARK)]}],
        "cache_control": MARK,
    }
    counted = [
        approximate_request_tokens(as_chat_request(parse(counting=True, **body), NO_LIMITS))
        for body in (bare, marked)
    ]
    assert counted[0] == counted[1]
    assert prompt_bound(chat(**bare)) == prompt_bound(chat(**marked))


def five(**where):
    """A body with five markers (four blocks' and its own), and ``where``'s changes."""
    body = {
        "system": [text("a", HOUR), text("b", HOUR)],
        "messages": [{"role": "user", "content": [text("c", MARK), text("d", MARK), text("e")]}],
        "cache_control": MARK,
    }
    return {**body, **where}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (five(), "A maximum of 4 blocks with cache_control may be provided. Found 5."),
        (
            five(cache_control=None, tools=[{**WEATHER, "cache_control": HOUR}]),
            "A maximum of 4 blocks with cache_control may be provided. Found 5.",
        ),
        (
            {"system": [text("a", MARK), text("b", HOUR)]},
            "system.1.cache_control.ttl: a ttl='1h' cache_control block must not come after a"
            " ttl='5m' cache_control block. Note that blocks are processed in the following"
            " order: `tools`, `system`, `messages`.",
        ),
        (
            {
                "tools": [{**WEATHER, "cache_control": MARK}],
                "messages": [{"role": "user", "content": [text("Hi", HOUR)]}],
            },
            "messages.0.content.0.cache_control.ttl: a ttl='1h' cache_control block must not"
            " come after a ttl='5m' cache_control block. Note that blocks are processed in the"
            " following order: `tools`, `system`, `messages`.",
        ),
        (
            {"messages": [{"role": "user", "content": [text("Hi"), text("", MARK)]}]},
            "messages.0.content.1.text: cache_control cannot be set for empty text blocks",
        ),
        (
            {"system": [text("", MARK)]},
            "system.0.text: cache_control cannot be set for empty text blocks",
        ),
        (
            {
                "messages": [
                    *HI,
                    {
                        "role": "assistant",
                        "content": [
                            {
                                "type": "thinking",
                                "thinking": "Hm.",
                                "signature": "s",
                                "cache_control": MARK,
                            },
                            text("Hello"),
                        ],
                    },
                    *HI,
                ]
            },
            "messages.1.content.0.thinking.cache_control: Extra inputs are not permitted",
        ),
        (
            {
                "messages": [
                    *HI,
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "redacted_thinking", "data": "x", "cache_control": None},
                            text("Hi"),
                        ],
                    },
                    *HI,
                ]
            },
            "messages.1.content.0.redacted_thinking.cache_control: Extra inputs are not permitted",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "Weather?"},
                    {"role": "assistant", "content": [CALL]},
                    {"role": "user", "content": [{**RESULT, "content": [text("Sunny", MARK)]}]},
                ]
            },
            "messages.2.content.0.tool_result.content.0.cache_control: cache_control may not be"
            " specified within `tool_result.content`. Instead, place it directly on"
            " `tool_result`",
        ),
        (
            {"system": [text("a", {"type": "ephemeral", "ttl": "2h"})]},
            "Invalid value: '2h'. Supported values are: '5m' and '1h'.",
        ),
        (
            {"system": [text("a", {"type": "persistent"})]},
            "Invalid value: 'persistent'. Supported values are: 'ephemeral'.",
        ),
    ],
)
def test_markers_anthropic_refuses_are_refused_in_its_words(body, message):
    assert refused(**body).message == message
    with pytest.raises(APIError, match=re.escape(message)):
        parse(counting=True, **{k: v for k, v in body.items()})


def test_four_markers_and_a_requests_own_on_a_marked_last_block_are_taken():
    assert chat(**five(system=[text("a", HOUR)])).cache_control == MARK
    last_marked = five(messages=[{"role": "user", "content": [text("c", MARK), text("d", MARK)]}])
    assert chat(**last_marked).cache_control == MARK, "the request's own marks that same block"
    assert (
        chat(
            system=[text("a", HOUR), text("b", MARK)],
            messages=[{"role": "user", "content": [text("c", MARK)]}],
        )
        .messages[0]
        .parts[1]
        .cache_control
        == MARK
    )
