"""parse_chat_request: OpenAI's request schema, rejected with OpenAI's own errors."""

import pytest

from chatparity.protocol.errors import APIError, invalid_json
from chatparity.protocol.request import (
    CHAT_COMPLETION_REQUEST,
    ChatRequest,
    Message,
    ResponseFormat,
    TextPart,
    Tool,
    ToolChoice,
    functions_as_tools,
    parse_chat_request,
    with_defaults,
    without_cache_markers,
)
from tests.support.wire import HI, WEATHER

ABSENT = object()  # a key left out of the body
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
LEGACY_CALL = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
LEGACY_ANSWER = {"role": "assistant", "content": None, "function_call": LEGACY_CALL}
GET_WEATHER = {key: value for key, value in WEATHER["function"].items() if key != "strict"}
REFUSED_PART = {"type": "refusal", "refusal": "I can't."}
TEXT_PART = {"type": "text", "text": "Hi"}
ANSWERED = [
    {"role": "user", "content": "Weather?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
]


def body(**changes):
    """A minimal valid body with ``changes`` applied; ABSENT removes a key."""
    merged = {"model": "smollm2", "messages": HI, **changes}
    return {key: value for key, value in merged.items() if value is not ABSENT}


def parse(**changes):
    return parse_chat_request(body(**changes))


# Accepted requests.


def test_every_field_is_parsed():
    sent = body(
        messages=[
            {"role": "system", "content": "Answer in JSON."},
            {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
            {
                "role": "user",
                "name": "ada",
                "content": [{"type": "text", "text": "Weather "}, {"type": "text", "text": "?"}],
            },
            {"role": "assistant", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
        ],
        stream=True,
        stream_options={"include_usage": True},
        n=2,
        max_completion_tokens=50,
        temperature=0.5,
        top_p=0.9,
        seed=7,
        stop=["\n\n", "END"],
        presence_penalty=-1,
        frequency_penalty=1.5,
        logit_bias={"50256": -100, "11": 2.5},
        logprobs=True,
        top_logprobs=3,
        response_format={
            "type": "json_schema",
            "json_schema": {
                "name": "weather",
                "description": "A forecast.",
                "schema": {"type": "object"},
                "strict": True,
            },
        },
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=False,
        reasoning_effort="low",
        service_tier="flex",
        user="user-1",
        # Accepted, not applied.
        audio={"voice": "alloy", "format": "wav"},
        modalities=["text", "audio"],
        metadata={"run": "1"},
        store=True,
        prediction={"type": "content", "content": "Sunny"},
        prompt_cache_key="k",
        prompt_cache_options={"mode": "explicit", "ttl": "30m"},
        prompt_cache_retention="24h",
        safety_identifier="s",
        verbosity="medium",
        web_search_options={},
    )

    assert parse_chat_request(sent) == ChatRequest(
        model="smollm2",
        messages=[
            Message("system", "Answer in JSON."),
            Message("developer", "Be brief.", parts=(TextPart("Be brief."),)),
            Message("user", "Weather ?", name="ada", parts=(TextPart("Weather "), TextPart("?"))),
            Message("assistant", None, tool_calls=[CALL]),
            Message("tool", "Sunny", tool_call_id="call_1"),
        ],
        body=sent,
        stream=True,
        include_usage=True,
        n=2,
        max_tokens=50,
        temperature=0.5,
        top_p=0.9,
        seed=7,
        stop=["\n\n", "END"],
        presence_penalty=-1.0,
        frequency_penalty=1.5,
        logit_bias={50256: -100.0, 11: 2.5},
        logprobs=True,
        top_logprobs=3,
        response_format=ResponseFormat(
            "json_schema", schema={"type": "object"}, name="weather", strict=True
        ),
        tools=[
            Tool(
                "get_weather",
                description="The weather in a city.",
                parameters=WEATHER["function"]["parameters"],
                strict=True,
            )
        ],
        tool_choice=ToolChoice("function", "get_weather"),
        parallel_tool_calls=False,
        reasoning_effort="low",
        service_tier="flex",
        user="user-1",
    )


def test_a_minimal_body_gets_openais_defaults_and_is_kept_as_sent():
    sent = body()
    request = parse_chat_request(sent)
    assert request == ChatRequest(model="smollm2", messages=[Message("user", "Hi")], body=sent)
    assert request.body is sent
    assert request.tool_choice == ToolChoice("none")


def test_null_means_not_given():
    request = parse(temperature=None, n=None, stop=None, tools=None, stream_options=None)
    assert (request.temperature, request.n, request.stop, request.tools) == (1.0, 1, [], [])


@pytest.mark.parametrize(
    ("changes", "field", "value"),
    [
        pytest.param({"stop": "END"}, "stop", ["END"], id="a string stop is a list of one"),
        pytest.param({"max_tokens": 9}, "max_tokens", 9, id="max_tokens alone"),
        pytest.param({"temperature": 1}, "temperature", 1.0, id="an integer is a decimal"),
        pytest.param({"tools": [WEATHER]}, "tool_choice", ToolChoice("auto"), id="auto with tools"),
        pytest.param(
            {"stream": True, "stream_options": {}}, "include_usage", False, id="no include_usage"
        ),
        pytest.param(
            {
                "response_format": {"type": "json_object"},
                "messages": [{"role": "user", "content": "A JSON list"}],
            },
            "response_format",
            ResponseFormat("json_object"),
            id="json_object when a message says json in any case",
        ),
        pytest.param(
            {"messages": [{"role": "assistant", "content": None, "function_call": LEGACY_CALL}]},
            "messages",
            [Message("assistant", None, function_call=LEGACY_CALL)],
            id="a legacy function_call stands in for content",
        ),
        pytest.param(
            {"messages": ANSWERED},
            "messages",
            [
                Message("user", "Weather?"),
                Message("assistant", None, tool_calls=[CALL]),
                Message("tool", "Sunny", tool_call_id="call_1"),
            ],
            id="tool results answer the calls",
        ),
        pytest.param(
            {"logit_bias": {"2147483647": 1, "0" * 5000 + "7": -1}},
            "logit_bias",
            {2147483647: 1.0, 7: -1.0},
            id="token ids up to 2**31 - 1, with any number of leading zeros",
        ),
        pytest.param({"model": "m" * 300}, "model", "m" * 300, id="a model name of any length"),
        pytest.param({"stop": []}, "stop", [], id="no stop"),
        pytest.param(
            {"logit_bias": {"1": -100, "2": 100}},
            "logit_bias",
            {1: -100.0, 2: 100.0},
            id="biases of -100 and 100",
        ),
        pytest.param(
            {"messages": [*HI, {"role": "assistant", "content": [REFUSED_PART, TEXT_PART]}]},
            "messages",
            [
                Message("user", "Hi"),
                Message("assistant", "I can't.Hi", parts=(TextPart("I can't."), TextPart("Hi"))),
            ],
            id="an assistant's refusal and text parts are its content",
        ),
        pytest.param(
            {"messages": [*HI, LEGACY_ANSWER, {"role": "function", "name": "f", "content": None}]},
            "messages",
            [
                Message("user", "Hi"),
                Message("assistant", None, function_call=LEGACY_CALL),
                Message("function", None, name="f"),
            ],
            id="a function's result may be null",
        ),
    ],
)
def test_accepted_values(changes, field, value):
    assert getattr(parse(**changes), field) == value


# Rejected requests: the whole envelope, as OpenAI sends it.


def case(changes, message, param=None, code=None, *, id):
    envelope = {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": param,
            "code": code,
        }
    }
    return pytest.param(changes, envelope, id=id)


def invalid_type(param, expected, got):
    return (
        f"Invalid type for '{param}': expected {expected}, but got {got} instead.",
        param,
        "invalid_type",
    )


def out_of_range(param, kind, side, bound, value):
    beyond, limit, sign = ("above", "max", "<=") if side == "max" else ("below", "min", ">=")
    return (
        f"Invalid '{param}': {kind} {beyond} {limit}imum value. Expected a value {sign} {bound},"
        f" but got {value} instead.",
        param,
        f"{kind}_{beyond}_{limit}_value",
    )


def missing(param):
    return (f"Missing required parameter: '{param}'.", param, "missing_required_parameter")


def empty(param):
    return (
        f"Invalid '{param}': empty array. Expected an array with minimum length 1, but got an"
        " empty array instead.",
        param,
        "empty_array",
    )


def unsupported(param, value, supported):
    return (f"Invalid value: '{value}'. Supported values are: {supported}.", param, "invalid_value")


def user(content=ABSENT, **fields):
    message = {"role": "user", "content": content, **fields}
    return [{key: value for key, value in message.items() if value is not ABSENT}]


PATTERN = "string does not match pattern. Expected a string that matches the pattern"
NULL_CONTENT = "Invalid value for 'content': expected a string, got null."
ROLES = "'system', 'assistant', 'user', 'function', 'tool', and 'developer'"
PART_TYPES = "'text', 'image_url', 'input_audio', 'refusal', 'audio', and 'file'"
TIERS = "'auto', 'default', 'flex', 'scale', or 'priority'"

ERRORS = [
    # The body as a whole.
    case({"model": ABSENT}, "you must provide a model parameter", id="no model"),
    case({"model": None}, "you must provide a model parameter", id="a null model"),
    case({"messages": ABSENT}, *missing("messages"), id="no messages"),
    case({"foo": 1}, "Unrecognized request argument supplied: foo", id="an unknown key"),
    case(
        {"zeta": 1, "alpha": 2},
        "Unrecognized request arguments supplied: alpha, zeta",
        id="unknown keys, sorted",
    ),
    case(
        {"model": ABSENT, "foo": 1},
        "you must provide a model parameter",
        id="a missing model beats an unknown key",
    ),
    case(
        {"n": "x", "foo": 1},
        "Unrecognized request argument supplied: foo",
        id="an unknown key beats a bad value",
    ),
    case(
        {"n": "x", "temperature": "y"},
        *invalid_type("n", "an integer", "a string"),
        id="body order: n first",
    ),
    case(
        {"temperature": "y", "n": "x"},
        *invalid_type("temperature", "a decimal", "a string"),
        id="body order: temperature first",
    ),
    # JSON types.
    case({"model": 7}, *invalid_type("model", "a string", "an integer"), id="model"),
    case(
        {"temperature": "hot"},
        *invalid_type("temperature", "a decimal", "a string"),
        id="temperature string",
    ),
    case(
        {"top_p": True},
        *invalid_type("top_p", "a decimal", "a boolean"),
        id="a boolean is not a decimal",
    ),
    case(
        {"n": 2.0},
        *invalid_type("n", "an integer", "a decimal number"),
        id="2.0 is not an integer",
    ),
    case(
        {"n": True}, *invalid_type("n", "an integer", "a boolean"), id="a boolean is not an integer"
    ),
    case({"seed": "1"}, *invalid_type("seed", "an integer", "a string"), id="seed"),
    case({"stream": "yes"}, *invalid_type("stream", "a boolean", "a string"), id="stream"),
    case({"logprobs": 1}, *invalid_type("logprobs", "a boolean", "an integer"), id="logprobs"),
    case({"user": {"a": 1}}, *invalid_type("user", "a string", "an object"), id="user"),
    case(
        {"messages": "Hi"},
        *invalid_type("messages", "an array of objects", "a string"),
        id="messages",
    ),
    case(
        {"messages": ["Hi"]},
        *invalid_type("messages[0]", "an object", "a string"),
        id="a message",
    ),
    case(
        {"messages": user(7)},
        *invalid_type("messages[0].content", "one of a string or array of objects", "an integer"),
        id="content",
    ),
    case(
        {"messages": [{"role": "developer", "content": None}]},
        *invalid_type("messages[0].content", "one of a string or array of objects", "null"),
        id="a null developer content",
    ),
    case(
        {"messages": user(["Hi"])},
        *invalid_type("messages[0].content[0]", "an object", "a string"),
        id="a content part",
    ),
    case(
        {"messages": user([{"type": "text", "text": 1}])},
        *invalid_type("messages[0].content[0].text", "a string", "an integer"),
        id="a part's text",
    ),
    case(
        {"messages": user("Hi", name=5)},
        *invalid_type("messages[0].name", "a string", "an integer"),
        id="a message name",
    ),
    case(
        {"stop": 1},
        *invalid_type("stop", "one of a string or array of strings", "an integer"),
        id="stop",
    ),
    case({"stop": ["a", 2]}, *invalid_type("stop[1]", "a string", "an integer"), id="a stop item"),
    case({"logit_bias": []}, *invalid_type("logit_bias", "an object", "an array"), id="logit_bias"),
    case(
        {"logit_bias": {"11": "x"}},
        *invalid_type("logit_bias.11", "a decimal", "a string"),
        id="a bias",
    ),
    case(
        {"metadata": "x"},
        *invalid_type("metadata", "a metadata object", "a string"),
        id="metadata",
    ),
    case(
        {"metadata": {"k": 7}},
        *invalid_type("metadata.k", "a string", "an integer"),
        id="a metadata value",
    ),
    case(
        {"service_tier": {}},
        *invalid_type("service_tier", f"one of {TIERS}", "an object"),
        id="service_tier",
    ),
    case(
        {"stream": True, "stream_options": {"include_usage": "yes"}},
        *invalid_type("stream_options.include_usage", "a boolean", "a string"),
        id="include_usage",
    ),
    case({"tools": "none"}, *invalid_type("tools", "an array of objects", "a string"), id="tools"),
    case(
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
        *invalid_type("tools[0].function.parameters", "an object", "an array"),
        id="tool parameters",
    ),
    case(
        {"tools": [WEATHER], "tool_choice": 7},
        *invalid_type(
            "tool_choice", "one of one of 'none', 'auto', or 'required' or object", "an integer"
        ),
        id="tool_choice",
    ),
    case(
        {"response_format": "json"},
        *invalid_type("response_format", "an object", "a string"),
        id="response_format",
    ),
    case(
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": []}}},
        *invalid_type("response_format.json_schema.schema", "an object", "an array"),
        id="a json schema",
    ),
    # Numeric ranges, printed as sent.
    case(
        {"temperature": 3}, *out_of_range("temperature", "decimal", "max", 2, 3), id="temperature 3"
    ),
    case(
        {"temperature": 2.5},
        *out_of_range("temperature", "decimal", "max", 2, 2.5),
        id="temperature 2.5",
    ),
    case(
        {"temperature": -0.5},
        *out_of_range("temperature", "decimal", "min", 0, -0.5),
        id="temperature below 0",
    ),
    case({"top_p": 1.5}, *out_of_range("top_p", "decimal", "max", 1, 1.5), id="top_p"),
    case(
        {"presence_penalty": -3},
        *out_of_range("presence_penalty", "decimal", "min", -2, -3),
        id="presence_penalty",
    ),
    case(
        {"frequency_penalty": 2.5},
        *out_of_range("frequency_penalty", "decimal", "max", 2, 2.5),
        id="frequency_penalty",
    ),
    case({"n": 0}, *out_of_range("n", "integer", "min", 1, 0), id="n 0"),
    case({"n": 129}, *out_of_range("n", "integer", "max", 128, 129), id="n 129"),
    case({"max_tokens": 0}, *out_of_range("max_tokens", "integer", "min", 1, 0), id="max_tokens"),
    case(
        {"max_completion_tokens": -1},
        *out_of_range("max_completion_tokens", "integer", "min", 1, -1),
        id="max_completion_tokens",
    ),
    case(
        {"logprobs": True, "top_logprobs": 21},
        *out_of_range("top_logprobs", "integer", "max", 20, 21),
        id="top_logprobs 21",
    ),
    case(
        {"logprobs": True, "top_logprobs": -1},
        *out_of_range("top_logprobs", "integer", "min", 0, -1),
        id="top_logprobs -1",
    ),
    case(
        {"logit_bias": {"50256": -101}},
        "Logit bias value -101.0 is invalid or outside of range [-100, 100]",
        "logit_bias",
        id="a bias below -100",
    ),
    case(
        {"logit_bias": {"hello": 1}},
        "Invalid key in 'logit_bias': hello. You should only be submitting non-negative integers.",
        "logit_bias",
        id="a bias keyed by a word",
    ),
    case(
        {"logit_bias": {"-1": 1}},
        "Invalid key in 'logit_bias': -1. You should only be submitting non-negative integers.",
        "logit_bias",
        id="a bias keyed by a negative id",
    ),
    case(
        {"logit_bias": {"2147483648": 1}},
        "Invalid key in 'logit_bias': 2147483648. Token ids are at most 2147483647.",
        "logit_bias",
        "invalid_value",
        id="a bias keyed by an id past 32 bits",
    ),
    case(
        {"logit_bias": {"9" * 5000: 1}},
        f"Invalid key in 'logit_bias': {'9' * 5000}. Token ids are at most 2147483647.",
        "logit_bias",
        "invalid_value",
        id="a bias keyed by more digits than int() converts",
    ),
    # Lengths.
    case({"messages": []}, *empty("messages"), id="no message"),
    case({"messages": user([])}, *empty("messages[0].content"), id="no content part"),
    case({"tools": []}, *empty("tools"), id="no tool"),
    case(
        {"stop": ["a", "b", "c", "d", "e"]},
        "Invalid 'stop': array too long. Expected an array with maximum length 4, but got an"
        " array with length 5 instead.",
        "stop",
        "array_above_max_length",
        id="five stops",
    ),
    # Security round 4: a 1 MB stop sequence was taken, and the local model looked
    # through up to all of it at each token.
    case(
        {"stop": "x" * 513},
        "Invalid 'stop': string too long. Expected a string with maximum length 512, but got a"
        " string with length 513 instead.",
        "stop",
        "string_above_max_length",
        id="a long stop",
    ),
    case(
        {"stop": ["a", "x" * 1_000_000]},
        "Invalid 'stop[1]': string too long. Expected a string with maximum length 512, but got"
        " a string with length 1000000 instead.",
        "stop[1]",
        "string_above_max_length",
        id="a megabyte stop",
    ),
    case(
        {"metadata": {f"k{i}": "v" for i in range(17)}},
        "Invalid 'metadata': too many properties. Expected an object with at most 16 properties,"
        " but got an object with 17 properties instead.",
        "metadata",
        "object_above_max_properties",
        id="17 metadata keys",
    ),
    case(
        {"metadata": {"k": "v" * 513}},
        "Invalid 'metadata.k': string too long. Expected a string with maximum length 512, but"
        " got a string with length 513 instead.",
        "metadata.k",
        "string_above_max_length",
        id="a long metadata value",
    ),
    case(
        {"tools": [{"type": "function", "function": {"name": "f" * 65}}]},
        "Invalid 'tools[0].function.name': string too long. Expected a string with maximum"
        " length 64, but got a string with length 65 instead.",
        "tools[0].function.name",
        "string_above_max_length",
        id="a long tool name",
    ),
    case(
        {"tools": [{"type": "function", "function": {"name": "get weather"}}]},
        f"Invalid 'tools[0].function.name': {PATTERN} '^[a-zA-Z0-9_-]+$'.",
        "tools[0].function.name",
        "invalid_value",
        id="a tool name with a space",
    ),
    case(
        {"messages": user("Hi", name="Ada Lovelace")},
        f"Invalid 'messages[0].name': {PATTERN} '^[a-zA-Z0-9_-]+$'.",
        "messages[0].name",
        "invalid_value",
        id="a message name with a space",
    ),
    # Enumerations.
    case(
        {"messages": [{"role": "foo", "content": "Hi"}]},
        *unsupported("messages[0].role", "foo", ROLES),
        id="a role",
    ),
    case({"messages": [{"content": "Hi"}]}, *missing("messages[0].role"), id="no role"),
    case(
        {"messages": user([{"type": "thinking", "text": "Hm"}])},
        *unsupported("messages[0].content[0].type", "thinking", PART_TYPES),
        id="a part type",
    ),
    case(
        {"messages": user([{"text": "Hi"}])},
        *missing("messages[0].content[0].type"),
        id="no part type",
    ),
    case(
        {"messages": user([{"type": "text"}])},
        *missing("messages[0].content[0].text"),
        id="a text part without text",
    ),
    case(
        {"reasoning_effort": "max"},
        *unsupported("reasoning_effort", "max", "'none', 'minimal', 'low', 'medium', and 'high'"),
        id="reasoning_effort",
    ),
    case(
        {"service_tier": "bogus"},
        *unsupported("service_tier", "bogus", TIERS.replace(" or ", " and ")),
        id="a service tier",
    ),
    case(
        {"verbosity": "loud"},
        *unsupported("verbosity", "loud", "'low', 'medium', and 'high'"),
        id="verbosity",
    ),
    case(
        {"tools": [WEATHER], "tool_choice": "any"},
        *unsupported("tool_choice", "any", "'none', 'auto', and 'required'"),
        id="a tool_choice mode",
    ),
    case(
        {"tools": [{"type": "retrieval", "function": {"name": "f"}}]},
        *unsupported("tools[0].type", "retrieval", "'function'"),
        id="a tool type",
    ),
    case(
        {"tools": [{"type": "function"}]},
        *missing("tools[0].function"),
        id="a tool without function",
    ),
    case(
        {"tools": [{"type": "function", "function": {}}]},
        *missing("tools[0].function.name"),
        id="a tool without name",
    ),
    case(
        {"response_format": {"type": "xml"}},
        *unsupported("response_format.type", "xml", "'text', 'json_object', and 'json_schema'"),
        id="a response format",
    ),
    case({"response_format": {}}, *missing("response_format.type"), id="no response format type"),
    # The content of a message.
    *(
        case(
            {"messages": user([{"type": "text", "text": "What is this?"}, {"type": kind}])},
            f"Invalid content type. {kind} is only supported by certain models.",
            "messages.[0].content.[1].type",
            id=f"an {kind} part",
        )
        for kind in ("image_url", "input_audio", "file")
    ),
    case({"messages": user()}, NULL_CONTENT, "messages.[0].content", id="a user without content"),
    case({"messages": user(None)}, NULL_CONTENT, "messages.[0].content", id="a null user content"),
    case(
        {"messages": [{"role": "system"}, *HI]},
        NULL_CONTENT,
        "messages.[0].content",
        id="a system message without content",
    ),
    case(
        {"messages": [*HI, {"role": "assistant", "content": None}]},
        NULL_CONTENT,
        "messages.[1].content",
        id="an assistant without content or calls",
    ),
    case(
        {"messages": user(tool_calls=[CALL])},
        NULL_CONTENT,
        "messages.[0].content",
        id="only an assistant's calls stand in for content",
    ),
    case(
        {"messages": [{"role": "developer"}]},
        *missing("messages[0].content"),
        id="a developer without content",
    ),
    case(
        {"messages": [*user(), {"role": "user", "content": 7}]},
        *invalid_type("messages[1].content", "one of a string or array of objects", "an integer"),
        id="a malformed later message beats a missing content",
    ),
    case(
        {"messages": [*HI, {"role": "function", "content": "42"}]},
        *missing("messages[1].name"),
        id="a function result without name",
    ),
    # Tool calls and their results.
    case(
        {"messages": [*HI, {"role": "assistant", "tool_calls": []}]},
        *empty("messages[1].tool_calls"),
        id="no tool call",
    ),
    case(
        {
            "messages": [
                *HI,
                {
                    "role": "assistant",
                    "tool_calls": [{"type": "function", "function": CALL["function"]}],
                },
            ]
        },
        *missing("messages[1].tool_calls[0].id"),
        id="a call without id",
    ),
    case(
        {"messages": [*HI, {"role": "assistant", "tool_calls": [{**CALL, "type": "custom"}]}]},
        *unsupported("messages[1].tool_calls[0].type", "custom", "'function'"),
        id="a call type",
    ),
    case(
        {
            "messages": [
                *HI,
                {
                    "role": "assistant",
                    "tool_calls": [{**CALL, "function": {"name": "f", "arguments": {}}}],
                },
            ]
        },
        *invalid_type("messages[1].tool_calls[0].function.arguments", "a string", "an object"),
        id="arguments that are not a string",
    ),
    case(
        {"messages": [*ANSWERED[:2], {"role": "tool", "content": "Sunny"}]},
        *missing("messages[2].tool_call_id"),
        id="a tool result without tool_call_id",
    ),
    case(
        {"messages": [*HI, ANSWERED[2]]},
        "Invalid parameter: messages with role 'tool' must be a response to a preceeding message"
        " with 'tool_calls'.",
        "messages.[1].role",
        id="a tool result without a call",
    ),
    case(
        {"messages": [*ANSWERED[:2], {**ANSWERED[2], "tool_call_id": "call_9"}]},
        "Invalid parameter: 'tool_call_id' of 'call_9' not found in 'tool_calls' of previous"
        " message.",
        "messages.[2].tool_call_id",
        id="a tool result for another call",
    ),
    case(
        {"messages": [*ANSWERED[:2], *HI]},
        "An assistant message with 'tool_calls' must be followed by tool messages responding to"
        " each 'tool_call_id'. The following tool_call_ids did not have response messages:"
        " call_1",
        "messages.[2].role",
        id="a call left unanswered",
    ),
    case(
        {"messages": ANSWERED[:2]},
        "An assistant message with 'tool_calls' must be followed by tool messages responding to"
        " each 'tool_call_id'. The following tool_call_ids did not have response messages:"
        " call_1",
        "messages",
        id="a call at the end",
    ),
    # Parameters that need another one.
    case(
        {"stream_options": {"include_usage": True}},
        "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
        "stream_options",
        id="stream_options without stream",
    ),
    case(
        {"stream": False, "stream_options": {"include_usage": True}},
        "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
        "stream_options",
        id="stream_options with stream false",
    ),
    case(
        {"top_logprobs": 2},
        "The 'top_logprobs' parameter is only allowed when 'logprobs' is enabled.",
        "top_logprobs",
        id="top_logprobs without logprobs",
    ),
    case(
        {"tool_choice": "none"},
        "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are"
        " specified.",
        "tool_choice",
        id="tool_choice without tools",
    ),
    case(
        {"parallel_tool_calls": True},
        "Invalid value for 'parallel_tool_calls': 'parallel_tool_calls' is only allowed when"
        " 'tools' are specified.",
        "parallel_tool_calls",
        id="parallel_tool_calls without tools",
    ),
    case(
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "clock"}}},
        "Invalid value for 'tool_choice': no function named 'clock' was specified in the 'tools'"
        " parameter.",
        "tool_choice",
        id="a named tool that is not in tools",
    ),
    case(
        {"tools": [WEATHER], "tool_choice": {"type": "function"}},
        *missing("tool_choice.function"),
        id="a named choice without function",
    ),
    case(
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {}}},
        *missing("tool_choice.function.name"),
        id="a named choice without name",
    ),
    case(
        {"response_format": {"type": "json_schema"}},
        *missing("response_format.json_schema"),
        id="json_schema without a schema",
    ),
    case(
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
        *missing("response_format.json_schema.name"),
        id="json_schema without name",
    ),
    case(
        {"response_format": {"type": "json_schema", "json_schema": {"name": "a.b"}}},
        f"Invalid 'response_format.json_schema.name': {PATTERN} '^[a-zA-Z0-9_-]+$'.",
        "response_format.json_schema.name",
        "invalid_value",
        id="a json_schema name with a dot",
    ),
    case(
        {"response_format": {"type": "json_object"}},
        "'messages' must contain the word 'json' in some form, to use 'response_format' of type"
        " 'json_object'.",
        "messages",
        id="json_object without the word json",
    ),
]

# OpenAI's recorded answers to requests at every boundary (issue 15): what it
# checks, and in which order.
FORMATS = "'mp3', 'opus', 'aac', 'flac', 'wav', and 'pcm16'"
LOGIT_BIAS_101 = ("Logit bias value 101.0 is invalid or outside of range [-100, 100]", "logit_bias")
STREAM_OPTIONS = (
    "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
    "stream_options",
)
TOP_LOGPROBS = (
    "The 'top_logprobs' parameter is only allowed when 'logprobs' is enabled.",
    "top_logprobs",
)
METADATA = ("The 'metadata' parameter is only allowed when 'store' is enabled.", "metadata")
BOTH_MAXIMA = (
    "Setting 'max_tokens' and 'max_completion_tokens' at the same time is not supported.",
    "max_tokens",
    "invalid_parameter_combination",
)
ONLY_AUDIO = (
    "Invalid value for 'modalities'. Only ['text'] and ['text', 'audio'] are supported.",
    "modalities",
    "invalid_value",
)
PARALLEL_TOOL_CALLS = (
    "Invalid value for 'parallel_tool_calls': 'parallel_tool_calls' is only allowed when 'tools'"
    " are specified.",
    "parallel_tool_calls",
)
ANY_PART = "'text', 'image_url', 'input_audio', 'refusal', 'audio', and 'file'"
BOUNDARIES = [
    # The model comes first.
    case({"model": ""}, "you must provide a model parameter", id="an empty model"),
    case(
        {"model": "", "messages": ABSENT},
        "you must provide a model parameter",
        id="an empty model without messages",
    ),
    case(
        {"model": "", "temperature": 9},
        "you must provide a model parameter",
        id="an empty model beats a bad value",
    ),
    # metadata: only stored completions have it.
    case({"metadata": {"run": "1"}}, *METADATA, id="metadata without store"),
    case({"metadata": {"run": "1"}, "store": False}, *METADATA, id="metadata with store false"),
    case(
        {"metadata": {"ab" + "k" * 60 + "xyz": "v"}, "store": True},
        "Invalid property name in 'metadata': 'abk...xyz' is too long. Expected a string with"
        " maximum length 64, but got a string with length 65 instead.",
        "metadata." + "ab" + "k" * 60 + "xyz",
        "property_name_above_max_length",
        id="a metadata key of 65 characters",
    ),
    case(
        {"metadata": {"k" * 64: "v" * 513}},
        "Invalid 'metadata." + "k" * 64 + "': string too long. Expected a string with maximum"
        " length 512, but got a string with length 513 instead.",
        "metadata." + "k" * 64,
        "string_above_max_length",
        id="a metadata value of 513 characters under a key of 64",
    ),
    case(
        {"metadata": {"k": 1}},
        *invalid_type("metadata.k", "a string", "an integer"),
        id="a metadata value's type before store",
    ),
    # logit_bias: its values, named as logit_bias, after every type and rule.
    case({"logit_bias": {"12345": 101}}, *LOGIT_BIAS_101, id="a bias of 101"),
    case(
        {"logit_bias": {"12345": 101}, "temperature": 3},
        *out_of_range("temperature", "decimal", "max", 2, 3),
        id="a range after logit_bias in the body beats its bias",
    ),
    case(
        {"logit_bias": {"12345": 101}, "top_logprobs": 2},
        *TOP_LOGPROBS,
        id="a rule across parameters beats a bias",
    ),
    case(
        {"logit_bias": {"12345": 101, "11": "x"}},
        *invalid_type("logit_bias.11", "a decimal", "a string"),
        id="a bias's type beats another's range",
    ),
    case(
        {"logit_bias": {"hello": 1}, "stream_options": {}},
        *STREAM_OPTIONS,
        id="a rule across parameters beats a key",
    ),
    case(
        {"logit_bias": {str(token): 1 for token in range(1025)}},
        "Invalid 'logit_bias': too many properties. Expected an object with at most 1024"
        " properties, but got an object with 1025 properties instead.",
        "logit_bias",
        "object_above_max_properties",
        id="1025 biases",
    ),
    # modalities and audio.
    case({"modalities": ["audio"]}, *ONLY_AUDIO, id="audio alone"),
    case({"modalities": ["audio", "audio"]}, *ONLY_AUDIO, id="audio twice"),
    # modalities without text is checked once every parameter was read, before the
    # parameters that need another; logprobs' type after it.
    case(
        {"modalities": ["audio"], "stop": 123},
        *invalid_type("stop", "one of a string or array of strings", "an integer"),
        id="a later parameter's type before audio alone",
    ),
    case(
        {"modalities": ["audio"], "temperature": 3},
        *out_of_range("temperature", "decimal", "max", 2, 3),
        id="a later parameter's range before audio alone",
    ),
    case(
        {"logprobs": "yes", "modalities": ["audio"]},
        *ONLY_AUDIO,
        id="audio alone before an earlier logprobs' type",
    ),
    case(
        {"modalities": ["audio"], "stream_options": {}},
        *ONLY_AUDIO,
        id="audio alone before a parameter that needs another",
    ),
    case(
        {"logprobs": "yes", "stop": 123},
        *invalid_type("stop", "one of a string or array of strings", "an integer"),
        id="any other parameter's type before logprobs' type",
    ),
    case(
        {"logprobs": 1, "top_logprobs": 2, "max_tokens": 1, "max_completion_tokens": 1},
        *invalid_type("logprobs", "a boolean", "an integer"),
        id="logprobs' type before the parameters that need another",
    ),
    case(
        {"stream": True, "stream_options": {"include_usage": "no"}, "logprobs": "yes"},
        *invalid_type("stream_options.include_usage", "a boolean", "a string"),
        id="a member's type before logprobs' type",
    ),
    case(
        {"modalities": [""]},
        *unsupported("modalities[0]", "", "'text' and 'audio'"),
        id="an empty modality",
    ),
    case(
        {"modalities": ["text", "UNKNOWN"]},
        *unsupported("modalities[1]", "UNKNOWN", "'text' and 'audio'"),
        id="an unknown modality",
    ),
    case({"modalities": []}, *empty("modalities"), id="no modality"),
    case(
        {"audio": {"format": "ogg", "voice": "alloy"}},
        *unsupported("audio.format", "ogg", FORMATS),
        id="an audio format",
    ),
    case({"audio": {"voice": "alloy"}}, *missing("audio.format"), id="no audio format"),
    case({"audio": {"format": "wav"}}, *missing("audio.voice"), id="no voice"),
    case(
        {"audio": {"format": "wav", "voice": 7}},
        *invalid_type("audio.voice", "one of a string or object", "an integer"),
        id="a voice",
    ),
    case(
        {"seed": 2**63},
        *out_of_range("seed", "integer", "max", 2**63 - 1, 2**63),
        id="a seed past 64 bits",
    ),
    case(
        {"seed": -(2**63) - 1},
        *out_of_range("seed", "integer", "min", -(2**63), -(2**63) - 1),
        id="a seed below 64 bits",
    ),
    # prediction and stream_options.
    case(
        {"prediction": {"content": "Sunny"}}, *missing("prediction.type"), id="no prediction type"
    ),
    case(
        {"prediction": {"type": "text", "content": "Sunny"}},
        *unsupported("prediction.type", "text", "'content'"),
        id="a prediction type",
    ),
    case({"prediction": {"type": "content"}}, *missing("prediction.content"), id="no prediction"),
    case(
        {"prediction": {"type": "content", "content": [{"type": "text"}]}},
        *missing("prediction.content[0].text"),
        id="a predicted part without text",
    ),
    case(
        {"stream": True, "stream_options": {"include_obfuscation": "no"}},
        *invalid_type("stream_options.include_obfuscation", "a boolean", "a string"),
        id="include_obfuscation",
    ),
    # max_tokens is the older name of max_completion_tokens.
    case({"max_tokens": 10, "max_completion_tokens": 10}, *BOTH_MAXIMA, id="both maxima"),
    case(
        {"max_completion_tokens": 10, "max_tokens": 0},
        *out_of_range("max_tokens", "integer", "min", 1, 0),
        id="a maximum's range beats the combination",
    ),
    case(
        {"max_tokens": 10, "max_completion_tokens": 10, "top_logprobs": 1},
        *TOP_LOGPROBS,
        id="a parameter's requirement beats the combination",
    ),
    # Rules across parameters, in OpenAI's order.
    case(
        {"stream_options": {}, "top_logprobs": 2},
        *TOP_LOGPROBS,
        id="top_logprobs before stream_options",
    ),
    case(
        {"metadata": {}, "stream_options": {}},
        *STREAM_OPTIONS,
        id="stream_options before metadata",
    ),
    case(
        {"metadata": {}, "parallel_tool_calls": True, "stream_options": {}},
        *STREAM_OPTIONS,
        id="stream_options before parallel_tool_calls",
    ),
    case(
        {"metadata": {"run": "1"}, "parallel_tool_calls": False},
        *PARALLEL_TOOL_CALLS,
        id="parallel_tool_calls before metadata",
    ),
    case(
        {"parallel_tool_calls": False, "top_logprobs": 0},
        *TOP_LOGPROBS,
        id="top_logprobs before parallel_tool_calls",
    ),
    # An assistant's content: text and refusal parts.
    case(
        {"messages": [*HI, {"role": "assistant", "content": [{"type": "refusal"}]}]},
        *missing("messages[1].content[0].refusal"),
        id="a refusal part without its refusal",
    ),
    case(
        {"messages": [*HI, {"role": "assistant", "content": [{"type": "unknown", "text": "Hi"}]}]},
        *unsupported("messages[1].content[0].type", "unknown", ANY_PART),
        id="an unknown part in an assistant's content",
    ),
    case(
        {"messages": [{"role": "user", "content": [{"type": "unknown", "text": "Hi"}]}]},
        *unsupported("messages[0].content[0].type", "unknown", ANY_PART),
        id="an unknown part in a user's content",
    ),
    case(
        {"messages": [*HI, {"role": "assistant", "content": [{"type": "image_url"}]}]},
        "Invalid 'messages[1]'. Image URLs are only allowed for messages with role 'user', but"
        " this message with role 'assistant' contains an image URL.",
        "messages[1]",
        "invalid_value",
        id="an image in an assistant's content",
    ),
    case(
        {"messages": [{"role": "system", "content": [{"type": "image_url"}]}, *HI]},
        "Invalid 'messages[0]'. Image URLs are only allowed for messages with role 'user', but"
        " this message with role 'system' contains an image URL.",
        "messages[0]",
        "invalid_value",
        id="an image in a system message",
    ),
    case(
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        "Invalid content type. image_url is only supported by certain models.",
        "messages.[0].content.[0].type",
        id="an image in a user's content, which this server does not read",
    ),
    case(
        {"messages": [*HI, {"role": "assistant", "content": [{"type": "refusal", "refusal": 1}]}]},
        *invalid_type("messages[1].content[0].refusal", "a string", "an integer"),
        id="a refusal that is not a string",
    ),
    # The deprecated functions.
    case({"functions": []}, *empty("functions"), id="no function"),
    case(
        {"functions": [{"description": "The weather."}]},
        *missing("functions[0].name"),
        id="a function without name",
    ),
    case(
        {"functions": [{"name": "get weather"}]},
        f"Invalid 'functions[0].name': {PATTERN} '^[a-zA-Z0-9_-]+$'.",
        "functions[0].name",
        "invalid_value",
        id="a function name with a space",
    ),
    case(
        {"functions": [GET_WEATHER], "function_call": "required"},
        *unsupported("function_call", "required", "'none' and 'auto'"),
        id="a function_call mode",
    ),
    case(
        {"functions": [GET_WEATHER], "function_call": 1},
        *invalid_type("function_call", "one of one of 'none' or 'auto' or object", "an integer"),
        id="a function_call of no type",
    ),
    case(
        {"function_call": "auto"},
        "Invalid value for 'function_call': 'function_call' is only allowed when 'functions' are"
        " specified.",
        "function_call",
        id="function_call without functions",
    ),
    case(
        {"functions": [GET_WEATHER], "function_call": {"name": "clock"}},
        "Invalid value for 'function_call': no function named 'clock' was specified in the"
        " 'functions' parameter.",
        "function_call",
        id="a named function that is not in functions",
    ),
    case(
        {"messages": [*HI, {"role": "function", "name": "f"}]},
        *missing("messages[1].content"),
        id="a function result without content",
    ),
    case(
        {"messages": [*HI, {"role": "assistant", "function_call": {"name": "f"}}]},
        *missing("messages[1].function_call.arguments"),
        id="a function_call without arguments",
    ),
]


# The parameters of CreateChatCompletionRequest in OpenAI's published OpenAPI document
# (github.com/openai/openai-openapi, openapi.json), in its order: each is one this server
# reads, or a deliberate refusal said here.
OPENAI_PARAMETERS = [
    "metadata", "top_logprobs", "temperature", "top_p", "user", "safety_identifier",
    "prompt_cache_key", "prompt_cache_retention", "prompt_cache_options", "messages", "model",
    "service_tier", "modalities", "verbosity", "reasoning_effort", "max_completion_tokens",
    "frequency_penalty", "presence_penalty", "web_search_options", "response_format", "audio",
    "store", "moderation", "stream", "stop", "logit_bias", "logprobs", "max_tokens", "n",
    "prediction", "seed", "stream_options", "tools", "tool_choice", "parallel_tool_calls",
    "function_call", "functions",
]  # fmt: skip
NOT_READ = {
    # Accepting it and answering unmoderated would be a lie; refused as unknown.
    "moderation": "Unrecognized request argument supplied: moderation",
}


@pytest.mark.parametrize("name", OPENAI_PARAMETERS)
def test_every_parameter_openai_documents_is_read_or_refused_on_purpose(name):
    members = {member.name for member in CHAT_COMPLETION_REQUEST.members}
    if name in NOT_READ:
        assert name not in members
        with pytest.raises(APIError, match=NOT_READ[name]):
            parse(**{name: {"model": "omni-moderation-latest"}})
    else:
        assert name in members


@pytest.mark.parametrize(("changes", "envelope"), [*ERRORS, *BOUNDARIES])
def test_rejected_with_openais_error(changes, envelope):
    with pytest.raises(APIError) as raised:
        parse(**changes)
    assert (raised.value.status, raised.value.envelope()) == (400, envelope)


@pytest.mark.parametrize("sent", [[], "hello", 1, None], ids=repr)
def test_a_body_that_is_not_an_object_is_unparseable(sent):
    with pytest.raises(APIError) as raised:
        parse_chat_request(sent)
    assert (raised.value.status, raised.value.envelope()) == (400, invalid_json().envelope())


# The deprecated functions: served as tools, answered in their own shape.

CLOCK = {"name": "get_time", "parameters": {"type": "object", "properties": {}}}
LEGACY_TOOLS = [
    Tool("get_weather", "The weather in a city.", GET_WEATHER["parameters"]),
    Tool("get_time", parameters=CLOCK["parameters"]),
]


@pytest.mark.parametrize(
    ("function_call", "choice"),
    [
        (ABSENT, ToolChoice("auto")),
        ("none", ToolChoice("none")),
        ("auto", ToolChoice("auto")),
        ({"name": "get_time"}, ToolChoice("function", "get_time")),
    ],
)
def test_functions_are_served_as_tools_with_one_call(function_call, choice):
    request = parse(functions=[GET_WEATHER, CLOCK], function_call=function_call)
    assert (request.tools, request.tool_choice) == (LEGACY_TOOLS, choice)
    assert request.legacy_functions
    assert not request.parallel_tool_calls  # a function_call carries one call


def test_functions_beside_tools_are_more_tools_answered_as_tools():
    request = parse(tools=[WEATHER], functions=[CLOCK], function_call={"name": "get_time"})
    assert [tool.name for tool in request.tools] == ["get_weather", "get_time"]
    assert request.tool_choice == ToolChoice("function", "get_time")
    assert not request.legacy_functions
    both = parse(tools=[WEATHER], tool_choice="none", functions=[CLOCK], function_call="auto")
    assert both.tool_choice == ToolChoice("none")  # tool_choice wins


LEGACY_HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    LEGACY_ANSWER,
    {"role": "function", "name": "get_weather", "content": "Sunny"},
    {"role": "assistant", "content": "Sunny."},
]


def test_functions_as_tools_is_a_valid_request_without_deprecated_parameters():
    sent = body(
        messages=LEGACY_HISTORY, functions=[GET_WEATHER], function_call={"name": "get_weather"}
    )
    converted = functions_as_tools(sent)
    assert converted == body(
        messages=[
            LEGACY_HISTORY[0],
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "call_1", "type": "function", "function": LEGACY_CALL}],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
            LEGACY_HISTORY[3],
        ],
        tools=[{"type": "function", "function": GET_WEATHER}],
        parallel_tool_calls=False,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    assert parse_chat_request(converted).tools == parse_chat_request(sent).tools
    assert sent["messages"] is LEGACY_HISTORY  # the request itself is kept as sent


def test_functions_as_tools_keeps_the_tools_and_the_choice_sent():
    sent = body(tools=[WEATHER], tool_choice="none", functions=[CLOCK], function_call="auto")
    converted = functions_as_tools(sent)
    assert converted == body(
        tools=[WEATHER, {"type": "function", "function": CLOCK}], tool_choice="none"
    )


@pytest.mark.parametrize(
    "messages",
    [
        pytest.param([*HI, LEGACY_ANSWER, *HI], id="a call no result answers"),
        pytest.param([*HI, {"role": "function", "name": "f", "content": "1"}], id="a lone result"),
    ],
)
def test_a_deprecated_call_or_result_without_its_pair_stays_as_sent(messages):
    assert functions_as_tools(body(messages=messages))["messages"] is messages


def test_a_request_without_functions_is_not_copied():
    sent = body(tools=[WEATHER])
    assert functions_as_tools(sent) is sent


def test_a_null_function_result_is_an_empty_tool_result():
    null = [*LEGACY_HISTORY[:2], {"role": "function", "name": "get_weather", "content": None}]
    assert functions_as_tools(body(messages=null))["messages"][2]["content"] == ""


# An alias's default parameters.


@pytest.mark.parametrize(
    ("defaults", "sent", "merged"),
    [
        ({"max_tokens": 2, "seed": 1}, {"seed": 2}, {"max_tokens": 2, "seed": 2}),
        ({"max_tokens": 2}, {"max_completion_tokens": 3}, {"max_completion_tokens": 3}),
        ({"max_completion_tokens": 2}, {"max_tokens": 3}, {"max_tokens": 3}),
        (
            {"max_tokens": 2},
            {"max_completion_tokens": None},
            {"max_tokens": 2, "max_completion_tokens": None},
        ),
    ],
    ids=["the client's wins", "under its newer name", "under its older name", "null is not given"],
)
def test_defaults_apply_to_what_the_client_does_not_set_under_either_name(defaults, sent, merged):
    assert with_defaults(defaults, sent) == merged
    parse_chat_request(with_defaults(defaults, body(**sent)))


# Cache markers, as OpenRouter's clients put them on chat parts and tools.

MARK = {"type": "ephemeral", "ttl": "1h"}


def test_markers_on_parts_calls_and_tools_are_kept():
    call = {**CALL, "cache_control": MARK}
    request = parse_chat_request(
        body(
            messages=[
                {
                    "role": "system",
                    "content": [{"type": "text", "text": "Rules.", "cache_control": MARK}],
                },
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
            ],
            tools=[{**WEATHER, "cache_control": MARK}],
        )
    )
    assert request.messages[0].parts == (TextPart("Rules.", MARK),)
    assert request.messages[2].tool_calls == [call]
    assert request.tools[0].cache_control == MARK
    assert not request.translated_markers, "the client's own: sent to a chat upstream as sent"


def test_a_body_without_its_markers():
    sent = body(
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Hi", "cache_control": MARK}]},
            {"role": "assistant", "content": None, "tool_calls": [{**CALL, "cache_control": MARK}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
        ],
        tools=[{**WEATHER, "cache_control": MARK}],
    )
    unmarked = without_cache_markers(sent)
    assert "cache_control" not in str(unmarked)
    assert unmarked["messages"][0]["content"] == "Hi", "as it was before its marker"
    assert unmarked["tools"] == [WEATHER]
    assert "cache_control" in str(sent), "the body itself is left as it was"


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        (
            {"type": "ephemeral", "ttl": "2h"},
            "Invalid value: '2h'. Supported values are: '5m' and '1h'.",
        ),
        ({"ttl": "5m"}, "Missing required parameter: 'messages[0].content[0].cache_control.type'."),
        (
            "ephemeral",
            "Invalid type for 'messages[0].content[0].cache_control': expected an object, but"
            " got a string instead.",
        ),
    ],
)
def test_a_marker_of_the_wrong_shape_is_refused(marker, message):
    part = {"type": "text", "text": "Hi", "cache_control": marker}
    with pytest.raises(APIError) as caught:
        parse_chat_request(body(messages=[{"role": "user", "content": [part]}]))
    assert caught.value.message == message
