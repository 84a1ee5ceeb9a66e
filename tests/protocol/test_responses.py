"""parse_responses_request and as_chat_request: the Responses request, validated with
OpenAI's errors, and the chat request that serves it."""

import itertools

import pytest

from chatparity.protocol.errors import APIError
from chatparity.protocol.request import Limits, ResponseFormat, TextPart, Tool, ToolChoice
from chatparity.protocol.responses import (
    as_chat_request,
    conversation,
    hosted_tool_refused,
    parse_responses_request,
)

NO_LIMITS = Limits()
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CALL = {
    "type": "function_call",
    "call_id": "call_1",
    "name": "get_weather",
    "arguments": '{"city":"Paris"}',
}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"}


def parse(limits=NO_LIMITS, **body):
    counter = itertools.count()
    return parse_responses_request(
        {"model": "smollm2", **body}, limits, lambda prefix: f"{prefix}_{next(counter)}"
    )


def chat(history=(), limits=NO_LIMITS, **body):
    return as_chat_request(parse(limits, **body), list(history), limits)


def refused(**body):
    with pytest.raises(APIError) as caught:
        chat(**body)
    return caught.value


# Accepted requests.


def test_a_string_input_is_one_user_message():
    request = parse(input="Hi")
    assert request.input == [
        {
            "id": "msg_0",
            "type": "message",
            "role": "user",
            "status": "completed",
            "content": [{"type": "input_text", "text": "Hi"}],
        }
    ]
    served = as_chat_request(request, [], NO_LIMITS)
    assert [(m.role, m.content) for m in served.messages] == [("user", "Hi")]
    assert (served.model, served.stream) == ("smollm2", False)


def test_instructions_are_a_system_message_before_everything():
    served = chat(input="Hi", instructions="Be brief.")
    assert [(m.role, m.content) for m in served.messages] == [
        ("system", "Be brief."),
        ("user", "Hi"),
    ]


def test_items_keep_their_ids_and_roles_and_text_parts_are_joined():
    request = parse(
        input=[
            {"role": "developer", "content": "Rules."},
            {
                "type": "message",
                "id": "msg_mine",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Weather "},
                    {"type": "input_text", "text": "?"},
                ],
            },
            {"role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]},
        ]
    )
    assert [item["id"] for item in request.input] == ["msg_0", "msg_mine", "msg_1"]
    assert request.input[2]["content"] == [
        {"type": "output_text", "text": "Sunny.", "annotations": []}
    ]
    served = as_chat_request(request, [], NO_LIMITS)
    assert [(m.role, m.content) for m in served.messages] == [
        ("developer", "Rules."),
        ("user", "Weather ?"),
        ("assistant", "Sunny."),
    ]


def test_function_calls_and_outputs_are_an_assistant_message_and_tool_messages():
    served = chat(
        input=[
            {"role": "user", "content": "Weather in Paris and Rome?"},
            CALL,
            {**CALL, "call_id": "call_2", "arguments": '{"city":"Rome"}'},
            {**OUTPUT, "call_id": "call_2", "output": "Rain"},
            OUTPUT,
        ],
        tools=[WEATHER],
    )
    _user, assistant, *tools = served.messages
    assert (assistant.role, assistant.content) == ("assistant", None)
    assert [call["id"] for call in assistant.tool_calls] == ["call_1", "call_2"]
    assert assistant.tool_calls[0]["function"] == {
        "name": "get_weather",
        "arguments": '{"city":"Paris"}',
    }
    assert [(m.role, m.tool_call_id, m.content) for m in tools] == [
        ("tool", "call_2", "Rain"),
        ("tool", "call_1", "Sunny"),
    ]


def test_a_call_after_a_text_message_joins_it():
    messages = conversation(
        [
            {"type": "message", "role": "assistant", "content": [{"text": "Looking."}]},
            {**CALL, "id": "fc_1"},
            {**OUTPUT, "id": "fco_1"},
        ]
    )
    assert messages[0]["content"] == "Looking."
    assert messages[0]["tool_calls"][0]["id"] == "call_1"


def test_the_history_goes_before_the_input():
    earlier = [
        *parse(input="My name is Ada.").input,
        {
            "id": "msg_out",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Hello Ada.", "annotations": []}],
        },
    ]
    served = chat(earlier, input="What is my name?", instructions="Be kind.")
    assert [(m.role, m.content) for m in served.messages] == [
        ("system", "Be kind."),
        ("user", "My name is Ada."),
        ("assistant", "Hello Ada."),
        ("user", "What is my name?"),
    ]


def test_tools_tool_choice_and_text_format_become_their_chat_forms():
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    served = chat(
        input="Hi",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=False,
        text={"format": {"type": "json_schema", "name": "answer", "schema": schema}},
        reasoning={"effort": "low"},
        max_output_tokens=64,
        temperature=0.5,
        top_p=0.9,
        user="ada",
        stream=True,
    )
    assert served.tools == [
        Tool("get_weather", "The weather in a city.", WEATHER["parameters"], strict=True)
    ]
    assert served.tool_choice == ToolChoice("function", "get_weather")
    assert served.parallel_tool_calls is False
    assert served.response_format == ResponseFormat("json_schema", schema, "answer", False)
    assert (served.reasoning_effort, served.max_tokens) == ("low", 64)
    assert (served.temperature, served.top_p, served.user, served.stream) == (0.5, 0.9, "ada", True)


def test_settings_are_repeated_with_openais_defaults():
    settings = parse(input="Hi").settings
    assert settings["tool_choice"] == "auto"
    assert settings["tools"] == []
    assert settings["text"] == {"format": {"type": "text"}, "verbosity": "medium"}
    assert settings["reasoning"] == {"effort": None, "summary": None}
    assert (settings["store"], settings["parallel_tool_calls"]) == (True, True)
    assert (settings["temperature"], settings["top_p"], settings["truncation"]) == (
        1.0,
        1.0,
        "disabled",
    )
    assert settings["metadata"] == {}
    tool = parse(input="Hi", tools=[WEATHER]).settings["tools"][0]
    assert tool["strict"] is True  # OpenAI's default for function tools


def test_empty_tools_and_auto_choice_ask_for_no_tools():
    served = chat(input="Hi", tools=[], tool_choice="auto", include=[], store=False)
    assert (served.tools, served.tool_choice) == ([], ToolChoice("none"))


def test_reasoning_items_of_another_model_are_passed_over():
    request = parse(input=[{"type": "reasoning", "id": "rs_1", "summary": []}])
    assert request.input == []


# Namespaces: functions grouped under a name (Codex's multi_agent_v1).

AGENTS = {
    "type": "namespace",
    "name": "agents",
    "description": "Sub-agents.",
    "tools": [
        {**WEATHER, "name": "spawn", "strict": False},
        {**WEATHER, "name": "close", "description": None},
    ],
}


def test_a_namespaces_functions_are_offered_flat_in_its_place_among_the_tools():
    served = chat(input="Hi", tools=[WEATHER, AGENTS, {**WEATHER, "name": "later"}])
    assert [tool.name for tool in served.tools] == [
        "get_weather",
        "agents__spawn",
        "agents__close",
        "later",
    ]
    spawn = served.tools[1]
    assert (spawn.description, spawn.parameters, spawn.strict) == (
        "The weather in a city.",
        WEATHER["parameters"],
        False,
    )


def test_the_response_repeats_the_namespace_as_sent():
    (namespace,) = parse(input="Hi", tools=[AGENTS]).settings["tools"]
    assert (namespace["type"], namespace["name"], namespace["description"]) == (
        "namespace",
        "agents",
        "Sub-agents.",
    )
    assert [tool["name"] for tool in namespace["tools"]] == ["spawn", "close"]
    assert namespace["tools"][1]["strict"] is True  # OpenAI's default, as for any function


def test_a_flat_name_never_takes_a_name_already_used():
    taken = {**WEATHER, "name": "agents__spawn"}
    names = parse(input="Hi", tools=[taken, AGENTS]).names
    flat = names.flat_name("agents", "spawn")
    assert flat != "agents__spawn"
    assert flat.startswith("agents__spawn_")
    assert len(flat) <= 64
    assert names.called(flat) == {"name": "spawn", "namespace": "agents"}
    assert names.called("agents__spawn") == {"name": "agents__spawn"}  # the client's own


def test_a_flat_name_too_long_is_shortened_and_stays_apart_from_its_neighbours():
    long_namespace = {**AGENTS, "name": "n" * 60}
    names = parse(input="Hi", tools=[long_namespace]).names
    spawn, close = names.flat_name("n" * 60, "spawn"), names.flat_name("n" * 60, "close")
    assert len(spawn) == len(close) == 64
    assert spawn != close
    assert names.called(close) == {"name": "close", "namespace": "n" * 60}


def test_two_namespaces_whose_joined_names_collide_get_two_flat_names():
    # a + b__c and a__b + c both join to a__b__c: each call must reach its own function.
    first = {**AGENTS, "name": "a", "tools": [{**WEATHER, "name": "b__c"}]}
    second = {**AGENTS, "name": "a__b", "tools": [{**WEATHER, "name": "c"}]}
    request = parse(input="Hi", tools=[first, second])
    offered = [tool.name for tool in as_chat_request(request, [], NO_LIMITS).tools]
    assert len(set(offered)) == 2
    names = request.names
    assert offered == [names.flat_name("a", "b__c"), names.flat_name("a__b", "c")]
    assert names.called(offered[0]) == {"name": "b__c", "namespace": "a"}
    assert names.called(offered[1]) == {"name": "c", "namespace": "a__b"}


@pytest.mark.parametrize(("length", "kept"), [(64, True), (65, False)])
def test_a_joined_name_is_kept_up_to_the_longest_function_name(length, kept):
    namespace = "n" * (length - len("__close"))
    names = parse(input="Hi", tools=[{**AGENTS, "name": namespace}]).names
    flat = names.flat_name(namespace, "close")
    assert (flat == f"{namespace}__close") is kept
    assert len(flat) <= 64
    assert names.called(flat) == {"name": "close", "namespace": namespace}


def test_the_same_tools_give_the_same_flat_names_on_every_turn():
    tools = [{**WEATHER, "name": "agents__spawn"}, AGENTS, {**AGENTS, "name": "more"}]
    assert parse(input="Hi", tools=tools).names == parse(input="Again", tools=tools).names


def test_a_call_of_a_namespaces_function_is_in_the_conversation_by_its_flat_name():
    call = {**CALL, "name": "close", "namespace": "agents"}
    request = parse(input=[{"role": "user", "content": "Go"}, call, OUTPUT], tools=[AGENTS])
    assert request.input[1]["namespace"] == "agents"  # as input_items lists it
    served = as_chat_request(request, [], NO_LIMITS)
    assert served.messages[1].tool_calls[0]["function"]["name"] == "agents__close"


def test_an_earlier_call_of_a_namespace_no_longer_offered_keeps_the_joined_name():
    call = {**CALL, "id": "fc_1", "name": "close", "namespace": "gone"}
    messages = conversation([call, {**OUTPUT, "id": "fco_1"}])
    assert messages[0]["tool_calls"][0]["function"]["name"] == "gone__close"


# Hosted tools: for the serving alias to pass on, leave out or refuse.


def test_hosted_tools_are_kept_as_sent_and_not_offered_as_functions():
    search = {"type": "web_search", "external_web_access": False}
    request = parse(input="Hi", tools=[WEATHER, search, {"type": "file_search", "x": 1}])
    assert request.hosted_tools == (search, {"type": "file_search", "x": 1})
    served = as_chat_request(request, [], NO_LIMITS)
    assert [tool.name for tool in served.tools] == ["get_weather"]
    assert served.hosted_tools == request.hosted_tools
    assert request.settings["tools"][1] == search


def test_hosted_tools_alone_offer_no_function():
    served = chat(input="Hi", tools=[{"type": "web_search_preview"}])
    assert (served.tools, served.tool_choice) == ([], ToolChoice("none"))


def test_a_refused_hosted_tool_is_named_where_it_was_sent():
    request = parse(input="Hi", tools=[WEATHER, AGENTS, {"type": "code_interpreter"}])
    error = hosted_tool_refused(request)
    assert (error.status, error.param, error.code) == (400, "tools[2].type", "unsupported_value")
    assert error.message == (
        "Invalid value: 'code_interpreter'. Tool type 'code_interpreter' is not supported by"
        " this server."
    )


# Refused requests.


@pytest.mark.parametrize(
    ("body", "message", "param", "code"),
    [
        ({"input": "Hi", "model": None}, "Missing required parameter: 'model'.", "model", None),
        ({"input": "Hi", "messages": []}, "Unknown parameter: 'messages'.", "messages", None),
        (
            {"input": 3},
            "Invalid type for 'input': expected one of a string or array of objects, but got an"
            " integer instead.",
            "input",
            "invalid_type",
        ),
        (
            {"input": [{"role": "tool", "content": "x"}]},
            "Invalid value: 'tool'. Supported values are: 'user', 'assistant', 'system', and"
            " 'developer'.",
            "input[0].role",
            "invalid_value",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "Invalid value: 'input_image'. Content type 'input_image' is not supported by this"
            " server.",
            "input[0].content[0].type",
            "unsupported_value",
        ),
        (
            {"input": "Hi", "tools": [WEATHER, {"type": "local_shell"}]},
            "Invalid value: 'local_shell'. Tool type 'local_shell' is not supported by this"
            " server.",
            "tools[1].type",
            "unsupported_value",
        ),
        (
            {"input": "Hi", "max_output_tokens": 8},
            "Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 16, but"
            " got 8 instead.",
            "max_output_tokens",
            "integer_below_min_value",
        ),
        (
            {"input": "Hi", "tool_choice": {"type": "function", "name": "nope"}},
            "Tool choice 'nope' not found in 'tools' parameter.",
            "tool_choice",
            None,
        ),
        (
            {"input": "Hi", "text": {"format": {"type": "json_object"}}},
            "Response input messages must contain the word 'json' in some form to use"
            " 'text.format' of type 'json_object'.",
            "input",
            None,
        ),
        (
            {"input": [CALL]},
            "No tool output found for function call call_1.",
            "input",
            None,
        ),
        (
            {"input": [OUTPUT]},
            "No tool call found for function call output with call_id call_1.",
            "input",
            None,
        ),
        (
            {"input": [CALL, {"role": "user", "content": "And?"}, OUTPUT]},
            "No tool output found for function call call_1.",
            "input",
            None,
        ),
        (
            {"input": "Hi", "tools": [{**AGENTS, "tools": [{"type": "custom", "name": "x"}]}]},
            "Invalid value: 'custom'. Tool type 'custom' is not supported by this server.",
            "tools[0].tools[0].type",
            "unsupported_value",
        ),
        (
            {"input": "Hi", "tools": [{"type": "namespace", "name": "agents", "tools": []}]},
            "Missing required parameter: 'tools[0].description'.",
            "tools[0].description",
            "missing_required_parameter",
        ),
        (
            {"input": "Hi", "tools": [{**AGENTS, "name": "a.b"}]},
            None,
            "tools[0].name",
            "invalid_value",
        ),
        (
            {"input": "Hi", "tools": [{**AGENTS, "tools": []}]},
            None,
            "tools[0].tools",
            "empty_array",
        ),
        ({}, "Missing required parameter: 'input'.", "input", "missing_required_parameter"),
        (
            {"input": "Hi", "metadata": {"k" * 65: "v"}},
            "Invalid property name in 'metadata': 'kkk...kkk' is too long. Expected a string with"
            " maximum length 64, but got a string with length 65 instead.",
            "metadata." + "k" * 65,
            "property_name_above_max_length",
        ),
        (
            {"input": "Hi", "background": True},
            "Background responses are not supported by this server.",
            "background",
            "unsupported_value",
        ),
    ],
)
def test_refused_with_openais_error(body, message, param, code):
    error = refused(**body)
    assert (error.status, error.type) == (400, "invalid_request_error")
    assert error.param == param
    if message is not None:
        assert error.message == message
    if code is not None:
        assert error.code == code


def test_unknown_parameters_are_named_one_at_a_time():
    error = refused(input="Hi", n=2, functions=[])
    assert (error.message, error.code) == ("Unknown parameter: 'functions'.", "unknown_parameter")


def test_a_conversation_over_the_message_limit_is_refused_on_input():
    limits = Limits(max_messages=2)
    history = parse(input="one").input + parse(input="two").input
    with pytest.raises(APIError) as caught:
        as_chat_request(parse(limits, input="three"), history, limits)
    assert caught.value.param == "input"


@pytest.mark.parametrize(
    "item",
    [
        {"role": "user", "content": [{"type": "input_text", "text": ""}] * 3},
        {**OUTPUT, "output": [{"type": "input_text", "text": ""}] * 3},
    ],
    ids=["message", "function_call_output"],
)
def test_more_parts_in_one_content_than_messages_allowed_is_refused_before_they_are_read(item):
    # Security round 3: 240,000 empty parts cost no token, but their parse and storage.
    with pytest.raises(APIError) as caught:
        parse(Limits(max_messages=2), input=[CALL, item] if "call_id" in item else [item])
    error = caught.value
    assert (error.status, error.code) == (400, "array_above_max_length")
    assert error.param.endswith("content" if "role" in item else "output")
    assert "maximum length 2, but got an array with length 3" in error.message


def test_a_text_over_the_content_limit_is_refused_where_it_is():
    with pytest.raises(APIError) as caught:
        parse(Limits(max_content_chars=3), input=[{"role": "user", "content": "four"}])
    assert caught.value.param == "input[0].content"
    assert caught.value.code == "string_above_max_length"


# Prompt caching.

MARK = {"type": "ephemeral"}


def test_the_prompt_caches_parameters_are_the_chat_requests():
    served = chat(
        input="Hi",
        prompt_cache_key="session-1",
        prompt_cache_retention="24h",
        prompt_cache_options={"mode": "explicit", "ttl": "30m"},
    )
    assert served.body["prompt_cache_key"] == "session-1"
    assert served.body["prompt_cache_retention"] == "24h"
    assert served.body["prompt_cache_options"] == {"mode": "explicit", "ttl": "30m"}


def test_markers_on_text_parts_ride_on_the_chat_requests_parts():
    """OpenRouter's form, for an upstream that speaks Anthropic's Messages API."""
    parts = [
        {"type": "input_text", "text": "Rules."},
        {"type": "input_text", "text": "Weather?", "cache_control": MARK},
    ]
    served = chat(input=[{"role": "user", "content": parts}])
    assert served.messages[0].content == "Rules.Weather?"
    assert [part.cache_control for part in served.messages[0].parts] == [None, MARK]
    assert served.translated_markers, "a chat upstream is sent none"
    assert not chat(input="Hi").translated_markers


def test_the_markers_of_earlier_responses_items_are_not_sent_again():
    """Stored items keep what was sent; only the new input's markers count."""
    marked = [
        {"role": "user", "content": [{"type": "input_text", "text": "Hi", "cache_control": MARK}]}
    ]
    earlier = parse(input=marked).input
    served = chat(earlier, input=marked)
    assert [m.parts for m in served.messages] == [(), (TextPart("Hi", MARK),)]


def test_an_invalid_marker_is_refused_in_openais_words():
    error = refused(
        input=[
            {
                "role": "user",
                "content": [
                    {
                        "type": "input_text",
                        "text": "Hi",
                        "cache_control": {"type": "ephemeral", "ttl": "9h"},
                    }
                ],
            }
        ]
    )
    assert error.message == "Invalid value: '9h'. Supported values are: '5m' and '1h'."
    assert error.param == "input[0].content[0].cache_control.ttl"
