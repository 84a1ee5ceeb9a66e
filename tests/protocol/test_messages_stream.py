"""MessageEncoder: backend events -> Anthropic's Messages stream events, in Anthropic's
order, and the message they add up to.

Each case is compared with a golden transcript in ``golden/``. Run with
``--update-golden`` to rewrite them after an intended change, and read the diff.
The real ``anthropic`` SDK reads each stream (over an in-memory transport) into the
very message the encoder answers without streaming.
"""

import re
from pathlib import Path

import anthropic
import httpx2
import pytest

from chatparity.protocol import errors
from chatparity.protocol.events import Finish, ReasoningDelta, TextDelta, ToolCallDelta, Usage
from chatparity.protocol.ids import call_id_of
from chatparity.protocol.messages_stream import (
    PING,
    MessageEncoder,
    sse_event,
    tool_input,
    usage_object,
)

GOLDEN = Path(__file__).parent / "golden"
USAGE = Usage(prompt_tokens=9, completion_tokens=3, cached_tokens=2)
HELLO = [TextDelta(0, "Hel"), TextDelta(0, "lo!"), Finish(0, "stop"), USAGE]
CALL_ID = "call_golden" + "0" * 18  # a backend's call id, in OpenAI's form
WEATHER_CALL = [
    ToolCallDelta(0, 0, "", id=CALL_ID, name="get_weather"),
    ToolCallDelta(0, 0, '{"city": '),
    ToolCallDelta(0, 0, '"Paris"}'),
]
CASES = {
    "messages_text": HELLO,
    "messages_tool_use": [
        TextDelta(0, "Let me check."),
        *WEATHER_CALL,
        Finish(0, "tool_calls"),
        USAGE,
    ],
    "messages_thinking": [
        ReasoningDelta(0, "The user "),
        ReasoningDelta(0, "greets me."),
        *HELLO,
    ],
    "messages_stop_sequence": [TextDelta(0, "1, 2"), Finish(0, "stop", stop_sequence=", 3"), USAGE],
}


def encoder(streaming=True):
    return MessageEncoder(
        message_id="msg_golden",
        model="claude-sonnet",
        input_tokens=8,
        request_id="req_golden",
        streaming=streaming,
    )


def events_of(backend_events, *, failure=None, streaming=True):
    """Every event a stream carries for ``backend_events``, and the encoder."""
    enc = encoder(streaming)
    events = enc.opening()
    for event in backend_events:
        events += enc.encode(event)
    events += enc.closing() if failure is None else enc.failing(failure)
    return events, enc


def types(events):
    return [event["type"] for event in events]


def read_by_the_sdk(body: bytes):
    """The message the real ``anthropic`` SDK makes of a stream ``body``."""
    answer = httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body)
    client = anthropic.Anthropic(
        api_key="key",
        base_url="http://gateway",
        http_client=httpx2.Client(transport=httpx2.MockTransport(lambda request: answer)),
    )
    with client.messages.stream(model="claude-sonnet", max_tokens=64, messages=[]) as stream:
        return stream.get_final_message()


@pytest.mark.parametrize("name", sorted(CASES))
def test_stream_matches_golden_transcript(name, request):
    events, _ = events_of(CASES[name])
    produced = b"".join(sse_event(event) for event in events)
    path = GOLDEN / f"{name}.sse"
    if request.config.getoption("--update-golden"):
        path.write_bytes(produced)
    assert produced == path.read_bytes()


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_sdk_reads_the_stream_as_the_message_not_streamed(name):
    events, enc = events_of(CASES[name])
    body = PING + b"".join(sse_event(event) for event in events)  # a ping before it all
    _, whole = events_of(CASES[name], streaming=False)
    assert read_by_the_sdk(body).to_dict() == whole.message() == enc.message()


def test_the_order_of_a_text_answer():
    events, _ = events_of(HELLO)
    assert types(events) == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


def test_message_start_is_empty_with_the_estimated_input_and_the_delta_the_final_usage():
    events, enc = events_of(HELLO)
    start = events[0]["message"]
    assert start["content"] == []
    assert start["stop_reason"] is None
    assert start["usage"]["input_tokens"] == 8
    assert start["usage"]["output_tokens"] == 0
    assert events[-2]["usage"] == {
        "input_tokens": 7,  # 9 prompt tokens, 2 of them read from a cache
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 2,
        "output_tokens": 3,
    }
    assert enc.message()["usage"] == {**events[-2]["usage"], "service_tier": "standard"}


def test_the_model_is_the_one_the_client_named_and_ids_are_the_encoders():
    _, enc = events_of(HELLO)
    message = enc.message()
    assert (message["id"], message["model"], message["type"], message["role"]) == (
        "msg_golden",
        "claude-sonnet",
        "message",
        "assistant",
    )


@pytest.mark.parametrize(
    ("finish", "stop_reason"),
    [
        (Finish(0, "stop"), "end_turn"),
        (Finish(0, "length"), "max_tokens"),
        (Finish(0, "content_filter"), "refusal"),
        (Finish(0, "stop", stop_sequence="END"), "stop_sequence"),
    ],
)
def test_stop_reasons(finish, stop_reason):
    _, enc = events_of([TextDelta(0, "x"), finish, USAGE])
    assert enc.message()["stop_reason"] == stop_reason


def test_a_call_stops_for_tool_use_even_when_the_tool_was_named():
    _, enc = events_of([*WEATHER_CALL, Finish(0, "stop"), USAGE])
    assert enc.message()["stop_reason"] == "tool_use"
    assert enc.message()["content"] == [
        {
            "type": "tool_use",
            "id": "toolu_golden" + "0" * 18,
            "name": "get_weather",
            "input": {"city": "Paris"},
        }
    ]
    _, cut = events_of([*WEATHER_CALL, Finish(0, "length"), USAGE])
    assert cut.message()["stop_reason"] == "max_tokens"


def test_parallel_calls_are_blocks_in_order():
    second = [
        ToolCallDelta(0, 1, "", id="call_" + "2" * 24, name="get_time"),
        ToolCallDelta(0, 1, "{}"),
    ]
    events, enc = events_of([*WEATHER_CALL, *second, Finish(0, "tool_calls"), USAGE])
    starts = [event for event in events if event["type"] == "content_block_start"]
    assert [(s["index"], s["content_block"]["name"]) for s in starts] == [
        (0, "get_weather"),
        (1, "get_time"),
    ]
    assert [block["id"] for block in enc.message()["content"]] == [
        "toolu_golden" + "0" * 18,
        "toolu_" + "2" * 24,
    ]


TOOL_USE_ID = re.compile(r"toolu_[A-Za-z0-9]{24}")


@pytest.mark.parametrize("streaming", [True, False], ids=["stream", "whole"])
def test_a_tool_use_id_is_anthropics_form_of_the_backends_call_id(streaming):
    calls = [
        ToolCallDelta(0, 0, "", id="call_" + "a" * 24, name="get_weather"),
        ToolCallDelta(0, 1, "", id="chatcmpl-tool-7", name="get_time"),  # another server's
        ToolCallDelta(0, 2, "", name="get_date"),  # none: one is made
        Finish(0, "tool_calls"),
        USAGE,
    ]
    events, enc = events_of(calls, streaming=streaming)
    used = [block["id"] for block in enc.message()["content"]]
    assert used[0] == "toolu_" + "a" * 24
    assert call_id_of(used[1]) == "chatcmpl-tool-7"
    assert TOOL_USE_ID.fullmatch(used[2])
    started = [e["content_block"]["id"] for e in events if e["type"] == "content_block_start"]
    assert started == (used if streaming else [])


@pytest.mark.parametrize(
    ("arguments", "finish", "expected"),
    [
        (['{"city": ', '"Pa'], "length", {}),  # cut short by max_tokens
        (["not ", "json"], "tool_calls", {}),
        (["[1, 2]"], "tool_calls", {}),
        (['{"city": ', '"Paris"}'], "tool_calls", {"city": "Paris"}),
    ],
)
def test_a_calls_input_json_deltas_join_into_the_object_of_the_message(arguments, finish, expected):
    """Whatever a backend's arguments are, the deltas a client joins are the JSON object
    the message holds: the real SDK reads them without raising."""
    calls = [
        ToolCallDelta(0, 0, "", id="toolu_1", name="get_weather"),
        *(ToolCallDelta(0, 0, fragment) for fragment in arguments),
    ]
    events, enc = events_of([*calls, Finish(0, finish), USAGE])
    joined = "".join(
        event["delta"]["partial_json"] for event in events if event["type"] == "content_block_delta"
    )
    assert tool_input(joined) == expected == enc.message()["content"][0]["input"]
    assert read_by_the_sdk(b"".join(map(sse_event, events))).to_dict() == enc.message()


def test_calls_streamed_side_by_side_are_blocks_one_after_the_other():
    """Each block is started, given its input and stopped before the next starts."""
    interleaved = [
        ToolCallDelta(0, 0, "", id="toolu_a", name="a"),
        ToolCallDelta(0, 1, "", id="toolu_b", name="b"),
        ToolCallDelta(0, 0, '{"x": '),
        ToolCallDelta(0, 1, '{"y": '),
        ToolCallDelta(0, 0, "1}"),
        ToolCallDelta(0, 1, "2}"),
    ]
    events, enc = events_of([*interleaved, Finish(0, "tool_calls"), USAGE])
    blocks = [(e["type"], e["index"]) for e in events if e["type"].startswith("content_block")]
    assert blocks == [
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
    ]
    assert [block["input"] for block in enc.message()["content"]] == [{"x": 1}, {"y": 2}]
    assert read_by_the_sdk(b"".join(map(sse_event, events))).to_dict() == enc.message()


def test_pings_go_out_while_a_long_input_is_held():
    enc = MessageEncoder(
        message_id="msg_golden", model="claude-sonnet", input_tokens=8,
        request_id="req_golden", ping_every=0,
    )  # fmt: skip
    events = enc.opening()
    for event in [*WEATHER_CALL, Finish(0, "tool_calls"), USAGE]:
        events += enc.encode(event)
    events += enc.closing()
    assert types(events)[1:5] == ["content_block_start", "ping", "ping", "content_block_delta"]
    assert read_by_the_sdk(b"".join(map(sse_event, events))).to_dict() == enc.message()


def test_an_empty_answer_has_no_blocks():
    events, enc = events_of([Finish(0, "stop"), USAGE])
    assert types(events) == ["message_start", "message_delta", "message_stop"]
    assert enc.message()["content"] == []
    assert enc.message()["stop_reason"] == "end_turn"


def test_other_choices_are_not_the_messages():
    _, enc = events_of([TextDelta(0, "a"), TextDelta(1, "b"), Finish(1, "stop"), *HELLO])
    assert enc.message()["content"] == [{"type": "text", "text": "aHello!"}]


def test_a_failure_after_the_first_byte_is_an_error_event_ending_the_stream():
    events, _ = events_of([TextDelta(0, "Hel")], failure=errors.timed_out("Too slow."))
    assert events[-1] == {
        "type": "error",
        "error": {"type": "timeout_error", "message": "Too slow."},
        "request_id": "req_golden",
    }
    assert sse_event(events[-1]).startswith(b"event: error\ndata: ")


def test_the_sdk_raises_the_error_event_by_its_type():
    events, _ = events_of([TextDelta(0, "Hel")], failure=errors.service_unavailable("Away."))
    with pytest.raises(anthropic.APIStatusError) as raised:
        read_by_the_sdk(b"".join(sse_event(event) for event in events))
    assert raised.value.body["error"] == {"type": "overloaded_error", "message": "Away."}


def test_not_streaming_makes_no_delta_events():
    events, _ = events_of(HELLO, streaming=False)
    assert types(events) == ["message_start", "message_delta", "message_stop"]


def test_no_finisher_from_the_backend_ends_the_turn():
    _, enc = events_of([TextDelta(0, "Hi")])
    assert enc.message()["stop_reason"] == "end_turn"
    assert enc.message()["usage"]["output_tokens"] == 1, "counted when the backend said none"


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [("", {}), ('{"a": 1}', {"a": 1}), ("[1]", {}), ('{"a": ', {})],
)
def test_a_calls_input_is_an_object(arguments, expected):
    assert tool_input(arguments) == expected


def test_the_usage_of_a_cached_prompt_in_anthropics_names():
    """Anthropic's ``input_tokens`` leaves out the cache's reads and writes; the writes
    are told by lifetime."""
    usage = Usage(1303, 7, cached_tokens=1000, cache_write_5m_tokens=100, cache_write_1h_tokens=200)
    assert usage_object(usage) == {
        "input_tokens": 3,
        "cache_creation_input_tokens": 300,
        "cache_read_input_tokens": 1000,
        "cache_creation": {"ephemeral_5m_input_tokens": 100, "ephemeral_1h_input_tokens": 200},
        "output_tokens": 7,
    }
    events, _ = events_of([TextDelta(0, "Hi"), Finish(0, "stop"), usage])
    assert events[-2]["usage"] == usage_object(usage), "message_delta: the cumulative usage"
    assert "cache_creation" not in usage_object(USAGE), "no writes, nothing to split"


def test_message_start_carries_the_usage_an_upstream_announced():
    """A Messages upstream says in its own message_start what it read from its cache and
    wrote to it: the SDKs keep that message_start's ``cache_creation``."""
    announced = Usage(1303, 1, cached_tokens=1000, cache_write_1h_tokens=300)
    start = encoder().opening(announced)[0]["message"]["usage"]
    assert start == {**usage_object(announced), "service_tier": "standard"}
    assert start["cache_creation"] == {
        "ephemeral_5m_input_tokens": 0,
        "ephemeral_1h_input_tokens": 300,
    }
