"""An upstream that speaks Anthropic's Messages API: the body it is asked with, and its
named events (or its whole message) read back with the chat path's distrust."""

import json
from pathlib import Path

import pytest

from chatparity.protocol.events import Finish, ReasoningDelta, TextDelta, ToolCallDelta, Usage
from chatparity.protocol.messages import as_chat_request as messages_as_chat
from chatparity.protocol.messages import parse_messages_request
from chatparity.protocol.messages_upstream import (
    DEFAULT_MAX_TOKENS,
    MessagesEventReader,
    upstream_request,
)
from chatparity.protocol.request import Limits, parse_chat_request
from chatparity.protocol.upstream import SSEReader, UpstreamError

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALL_ID = "call_" + "P" * 24  # OpenAI's form: Anthropic's toolu_ and the same 24 upstream
TOOL_USE_ID = "toolu_" + "P" * 24
CALLING = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": CALL_ID,
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": CALL_ID, "content": "Sunny"},
]
WEATHER_TOOL = {
    "name": "get_weather",
    "input_schema": WEATHER["function"]["parameters"],
    "description": "The weather in a city.",
}
TOOL_USE = {
    "type": "tool_use",
    "id": TOOL_USE_ID,
    "name": "get_weather",
    "input": {"city": "Paris"},
}
GOLDEN = Path(__file__).parent / "golden"
EVERYTHING = frozenset({"tools", "temperature", "top_p", "stop", "response_format", "user"})


def asked(forwarded=EVERYTHING, **body):
    """The /messages body for a chat request of ``body``."""
    body = {"model": "alias", "messages": [{"role": "user", "content": "Hi"}], **body}
    request = parse_chat_request(body, Limits())
    given = {name: value for name, value in body.items() if name in forwarded or name == "messages"}
    if "reasoning_effort" in body:
        given["reasoning_effort"] = body["reasoning_effort"]
    return upstream_request(request, "claude-sonnet-4-5", given)


# The request.


def test_the_conversation_with_system_first_and_a_default_max_tokens():
    body = asked(
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": "Answer in French."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Bonjour"},
            {"role": "user", "content": [{"type": "text", "text": "Ça va?"}]},
        ]
    )
    assert body == {
        "model": "claude-sonnet-4-5",
        "max_tokens": DEFAULT_MAX_TOKENS,
        "system": "Be brief.\n\nAnswer in French.",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Bonjour"}]},
            {"role": "user", "content": [{"type": "text", "text": "Ça va?"}]},
        ],
        "stream": True,
    }


def test_calls_are_tool_uses_and_tool_messages_results_in_one_user_turn():
    body = asked(
        messages=[*CALLING, {"role": "user", "content": "And tomorrow?"}],
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=300,
    )
    assert body["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": TOOL_USE_ID,
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": TOOL_USE_ID, "content": "Sunny"},
                {"type": "text", "text": "And tomorrow?"},
            ],
        },
    ]
    assert body["tools"] == [
        {
            "name": "get_weather",
            "input_schema": WEATHER["function"]["parameters"],
            "description": "The weather in a city.",
        }
    ]
    assert body["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert body["max_tokens"] == 300


def test_the_deprecated_functions_are_tools_too():
    function = WEATHER["function"]
    body = asked(
        forwarded=frozenset({"functions", "function_call"}),
        functions=[function],
        function_call={"name": "get_weather"},
    )
    assert [tool["name"] for tool in body["tools"]] == ["get_weather"]
    assert body["tool_choice"] == {
        "type": "tool",
        "name": "get_weather",
        "disable_parallel_tool_use": True,
    }


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", {"type": "auto"}),
        ("none", {"type": "none"}),
        (
            {"type": "function", "function": {"name": "get_weather"}},
            {"type": "tool", "name": "get_weather"},
        ),
    ],
)
def test_tool_choices(choice, expected):
    assert asked(tools=[WEATHER], tool_choice=choice)["tool_choice"] == expected


def test_sampling_stops_user_and_format():
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    body = asked(
        temperature=1.5,
        top_p=0.9,
        stop=["END"],
        user="u1",
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    )
    assert body["temperature"] == 1.0, "Anthropic's most"
    assert (body["top_p"], body["stop_sequences"]) == (0.9, ["END"])
    assert body["metadata"] == {"user_id": "u1"}
    assert body["output_config"] == {"format": {"type": "json_schema", "schema": schema}}


def test_what_anthropic_refuses_of_whitespace_is_left_out():
    """Text of whitespace alone (a model's "\\n\\n" before its calls, an empty system
    message), a whitespace stop sequence and a prefill's trailing whitespace are each
    Anthropic's 400: they are not sent."""
    calling = {**CALLING[1], "content": "\n\n"}
    body = asked(
        messages=[
            {"role": "system", "content": " "},
            CALLING[0],
            calling,
            CALLING[2],
            {"role": "user", "content": "\t"},
            {"role": "assistant", "content": "The weather is "},
        ],
        stop=["\n", "END", " \t"],
    )
    assert "system" not in body
    assert body["stop_sequences"] == ["END"]
    assert body["messages"][1:] == [
        {"role": "assistant", "content": [{"type": "tool_use", "id": TOOL_USE_ID,
                                           "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": TOOL_USE_ID,
                                      "content": "Sunny"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "The weather is"}]},
    ]  # fmt: skip
    assert "stop_sequences" not in asked(stop=["\n"])


def test_what_is_not_forwarded_is_not_sent():
    body = asked(forwarded=frozenset(), temperature=0.5, user="u1", tools=[WEATHER])
    assert set(body) == {"model", "max_tokens", "messages", "stream"}


def test_an_effort_asks_for_thinking_where_anthropic_allows_it():
    assert asked(reasoning_effort="high", max_tokens=32000)["thinking"] == {
        "type": "enabled",
        "budget_tokens": 16384,
    }
    assert asked(reasoning_effort="high", max_tokens=4000)["thinking"]["budget_tokens"] == 3999
    for refused in (
        {"reasoning_effort": "none"},
        {"reasoning_effort": "low", "max_tokens": 1024},  # no room for the smallest budget
        {"reasoning_effort": "low", "temperature": 0.2},
        {"reasoning_effort": "low", "tools": [WEATHER], "tool_choice": "required"},
        {"reasoning_effort": "low", "messages": CALLING, "tools": [WEATHER]},  # within a call
    ):
        assert "thinking" not in asked(**{"max_tokens": 8000, **refused}), refused


# Reading the answer.

# Streams as Anthropic sends them (the SDK's recorded fixtures' shape).
TEXT_STREAM = (GOLDEN / "anthropic_text.sse").read_text()

TOOL_STREAM = (GOLDEN / "anthropic_tool_use.sse").read_text()


def frame(payload):
    return f"event: {payload['type']}\ndata: {json.dumps(payload)}\n\n"


def read(stream, reader=None):
    reader = reader or MessagesEventReader(n=1, prompt_tokens=4)
    sse = SSEReader()
    events = []
    for line in stream.splitlines():
        event = sse.feed(line)
        if event is not None:
            events += reader.read(event)
    return events, reader


def test_a_stream_of_thinking_and_text():
    events, reader = read(TEXT_STREAM)
    assert events == [
        ReasoningDelta(0, "A greeting."),
        TextDelta(0, "Hello"),
        TextDelta(0, " there!"),
        Finish(0, "stop"),
    ]
    assert reader.done
    assert reader.usage == Usage(
        19, 6, cached_tokens=5, reasoning_tokens=3, cache_write_5m_tokens=3
    ), "the cache's writes, of 5 minutes when their lifetime is not said"


def test_a_stream_of_a_tool_use():
    events, reader = read(TOOL_STREAM)
    assert events == [
        ToolCallDelta(0, 0, "", id="toolu_01", name="get_weather", tokens=0),
        ToolCallDelta(0, 0, '{"city": "Par'),
        ToolCallDelta(0, 0, 'is"}'),
        Finish(0, "tool_calls"),
    ]
    assert reader.usage == Usage(377, 40)


def test_anthropics_tool_use_ids_are_call_ids_inside_and_its_own_ids_again_upstream():
    stream = TOOL_STREAM.replace('"id":"toolu_01"', f'"id":"{TOOL_USE_ID}"')
    events, _ = read(stream)
    assert events[0] == ToolCallDelta(0, 0, "", id=CALL_ID, name="get_weather", tokens=0)
    sent = asked(messages=CALLING, tools=[WEATHER])["messages"]
    assert [block["id"] for block in sent[1]["content"]] == [TOOL_USE_ID]
    assert [block["tool_use_id"] for block in sent[2]["content"]] == [TOOL_USE_ID]


def test_a_call_id_of_another_form_goes_upstream_encoded_and_comes_back_as_itself():
    calling = json.loads(json.dumps(CALLING).replace(CALL_ID, "fc-7"))
    sent = asked(messages=calling, tools=[WEATHER])["messages"]
    (use,) = sent[1]["content"]
    assert sent[2]["content"][0]["tool_use_id"] == use["id"]
    events, _ = read(TOOL_STREAM.replace('"id":"toolu_01"', f'"id":"{use["id"]}"'))
    assert events[0].id == "fc-7"


def test_a_named_tool_finishes_as_chat_does():
    events, _ = read(TOOL_STREAM, MessagesEventReader(n=1, prompt_tokens=4, call_finish="stop"))
    assert events[-1] == Finish(0, "stop")


def test_the_stop_sequence_that_matched_is_kept():
    stream = TEXT_STREAM.replace(
        '"stop_reason":"end_turn","stop_sequence":null',
        '"stop_reason":"stop_sequence","stop_sequence":"END"',
    )
    events, _ = read(stream)
    assert events[-1] == Finish(0, "stop", stop_sequence="END")


@pytest.mark.parametrize(
    ("reason", "finish"),
    [
        ("max_tokens", "length"),
        ("refusal", "content_filter"),
        ("pause_turn", "stop"),
        ("new", "stop"),
    ],
)
def test_stop_reasons(reason, finish):
    events, _ = read(TEXT_STREAM.replace('"stop_reason":"end_turn"', f'"stop_reason":"{reason}"'))
    assert events[-1] == Finish(0, finish)


def test_a_whole_message():
    message = {
        "id": "msg_3",
        "type": "message",
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Weather.", "signature": "x"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_9", "name": "get_weather", "input": {"city": "Oslo"}},
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 20, "output_tokens": 9},
    }
    reader = MessagesEventReader(n=1, prompt_tokens=4)
    assert reader.read_completion(json.dumps(message).encode()) == [
        ReasoningDelta(0, "Weather.", tokens=2),
        TextDelta(0, "Checking.", tokens=3),
        ToolCallDelta(0, 0, "", id="toolu_9", name="get_weather", tokens=0),
        ToolCallDelta(0, 0, '{"city":"Oslo"}'),
        Finish(0, "tool_calls"),
    ]
    assert reader.usage == Usage(20, 9)


@pytest.mark.parametrize(
    "usage",
    [
        '{"output_tokens":-1}',
        '{"output_tokens":"many"}',
        '{"output_tokens":99999999999}',
        '{"output_tokens":1,"cache_read_input_tokens":true}',
    ],
)
def test_usage_that_cannot_be_believed_is_counted_instead(usage):
    stream = TEXT_STREAM.replace(
        '"usage":{"output_tokens":6,"output_tokens_details":{"thinking_tokens":3}}',
        f'"usage":{usage}',
    )
    _, reader = read(stream)
    assert reader.usage == Usage(4, 3, counted=True)
    assert reader.refused_usage is not None


def test_an_error_event_is_the_upstreams_error_told_in_our_words():
    error = {"type": "overloaded_error", "message": "Overloaded at host-7"}
    stream = TEXT_STREAM.split("event: content_block_start")[0] + frame(
        {"type": "error", "error": error}
    )
    with pytest.raises(UpstreamError) as raised:
        read(stream)
    assert raised.value.status == 502
    assert raised.value.type == "overloaded_error"
    assert "host-7" not in raised.value.message
    assert raised.value.upstream_message == "Overloaded at host-7"


@pytest.mark.parametrize(
    "data",
    [
        "not json",
        "[1, 2]",
        '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":5}}',
        '{"type":"content_block_delta","index":0}',
        '{"type":"content_block_start","index":0,"content_block":"text"}',
        '{"type":"message_delta","delta":null}',
    ],
)
def test_what_is_not_the_messages_wire_is_malformed(data):
    with pytest.raises(UpstreamError) as raised:
        read(f"event: x\ndata: {data}\n\n")
    assert raised.value.status == 502


def test_deltas_of_blocks_never_started_and_unknown_events_are_passed_over():
    server_tool = {"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}}
    events, _ = read(
        frame(
            {
                "type": "content_block_delta",
                "index": 4,
                "delta": {"type": "input_json_delta", "partial_json": "{"},
            }
        )
        + frame({"type": "content_block_start", "index": 1, "content_block": server_tool})
        + frame(
            {
                "type": "content_block_start",
                "index": 2,
                "content_block": {"type": "redacted_thinking", "data": "x"},
            }
        )
        + frame({"type": "brand_new_event"})
    )
    assert events == []


# Prompt caching: the markers a client set, where it set them; the cache's usage read.

HOUR = {"type": "ephemeral", "ttl": "1h"}
MARK = {"type": "ephemeral"}
MARKED = {
    "model": "alias",
    "max_tokens": 64,
    "system": [
        {"type": "text", "text": "You are Claude Code.", "cache_control": HOUR},
        {"type": "text", "text": "Be brief."},
    ],
    "tools": [{**WEATHER_TOOL, "cache_control": HOUR}],
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "<reminder>"},
                {"type": "text", "text": "Weather?"},
            ],
        },
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Looking."}, {**TOOL_USE, "cache_control": MARK}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": TOOL_USE_ID,
                    "content": "Sunny",
                    "cache_control": MARK,
                },
                {"type": "text", "text": "Thanks"},
            ],
        },
    ],
}


def marked(body, **options):
    """The /messages body for a Messages request of ``body``, as its backend writes it."""
    request = messages_as_chat(parse_messages_request(body, Limits()), Limits())
    forwarded = {name: request.body[name] for name in ("messages", "tools") if name in request.body}
    return upstream_request(request, "claude-sonnet-4-5", forwarded, **options)


def test_a_marked_request_reaches_the_upstream_block_for_block_as_sent():
    body = marked(MARKED)
    for name in ("system", "tools", "messages"):
        assert body[name] == MARKED[name], name
    assert "cache_control" not in body


def test_a_requests_own_marker_reaches_the_upstream():
    """Anthropic's automatic caching: the marker on the request, not on a block."""
    body = marked({**MARKED, "tools": [WEATHER_TOOL], "cache_control": HOUR})
    assert body["cache_control"] == HOUR
    assert (
        marked(
            {
                "model": "a",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": "Hi"}],
                "cache_control": MARK,
            }
        )["cache_control"]
        == MARK
    )


def test_an_upstream_that_refuses_ttl_gets_each_marker_without_it():
    body = marked(MARKED, cache_ttl=False)
    assert body["system"][0]["cache_control"] == MARK
    assert body["tools"][0]["cache_control"] == MARK
    assert body["messages"][1]["content"][1]["cache_control"] == MARK


def test_a_chat_clients_markers_on_parts_reach_the_upstream():
    """OpenRouter's form: markers on text parts (a tool's result: on its block)."""
    body = asked(
        messages=[
            {
                "role": "system",
                "content": [{"type": "text", "text": "Rules.", "cache_control": HOUR}],
            },
            *CALLING[:2],
            {
                "role": "tool",
                "tool_call_id": CALL_ID,
                "content": [{"type": "text", "text": "Sunny", "cache_control": MARK}],
            },
            {"role": "user", "content": "   "},
        ]
    )
    assert body["system"] == [{"type": "text", "text": "Rules.", "cache_control": HOUR}]
    result = body["messages"][-1]["content"][0]
    assert result == {
        "type": "tool_result",
        "tool_use_id": TOOL_USE_ID,
        "content": "Sunny",
        "cache_control": MARK,
    }


def test_a_request_without_markers_is_written_as_before():
    body = asked(
        messages=[
            {
                "role": "system",
                "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
            },
            {
                "role": "user",
                "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}],
            },
        ]
    )
    assert body["system"] == "AB"
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "Hi there"}]}]
    assert "cache_control" not in json.dumps(body)


def usage_of(start_usage, delta_usage):
    stream = frame({"type": "message_start", "message": {"usage": start_usage}}) + "".join(
        frame(event)
        for event in (
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "Hi"},
            },
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": delta_usage},
            {"type": "message_stop"},
        )
    )
    return read(stream)[1].usage


def test_cache_reads_and_writes_by_lifetime_are_read_from_message_start_and_message_delta():
    start = {
        "input_tokens": 3,
        "cache_read_input_tokens": 1000,
        "cache_creation_input_tokens": 300,
        "cache_creation": {"ephemeral_5m_input_tokens": 100, "ephemeral_1h_input_tokens": 200},
        "output_tokens": 1,
    }
    delta = {
        "input_tokens": 3,
        "cache_read_input_tokens": 1000,
        "cache_creation_input_tokens": 300,
        "output_tokens": 7,
    }
    assert usage_of(start, delta) == Usage(
        1303, 7, cached_tokens=1000, cache_write_5m_tokens=100, cache_write_1h_tokens=200
    )
    assert usage_of({"input_tokens": 3, "output_tokens": 1}, delta) == Usage(
        1303, 7, cached_tokens=1000, cache_write_5m_tokens=300
    ), "the delta's cumulative counts stand; writes of no said lifetime are 5m's"


@pytest.mark.parametrize(
    "lifetimes",
    [
        {"ephemeral_1h_input_tokens": 301},  # more of an hour than was written
        {"ephemeral_1h_input_tokens": -1},
        {"ephemeral_1h_input_tokens": "x"},
    ],
)
def test_cache_writes_that_cannot_be_believed_are_counted_instead(lifetimes):
    start = {"input_tokens": 3, "cache_creation_input_tokens": 300, "cache_creation": lifetimes}
    usage = usage_of(start, {"output_tokens": 2})
    assert usage.counted
    assert (usage.cached_tokens, usage.cache_write_tokens) == (0, 0)
