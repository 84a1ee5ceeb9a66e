"""ResponseEncoder: backend events -> the Responses API's typed events, in OpenAI's order.

Each case is compared with a golden transcript in ``golden/``. Run with
``--update-golden`` to rewrite them after an intended change, and read the diff.
"""

import itertools
from pathlib import Path

import orjson
import pytest

from chatparity.protocol.errors import APIError
from chatparity.protocol.events import Finish, TextDelta, ToolCallDelta, Usage
from chatparity.protocol.responses import ToolNames
from chatparity.protocol.responses_stream import ResponseEncoder, sse_event
from tests.support.wire import TWO_DELTAS

GOLDEN = Path(__file__).parent / "golden"
SETTINGS = {"store": True, "tools": [], "tool_choice": "auto"}
USAGE = Usage(prompt_tokens=9, completion_tokens=3, cached_tokens=2)
HELLO = [TextDelta(0, "Hel"), TextDelta(0, "lo!"), Finish(0, "stop"), USAGE]
WEATHER_CALL = [
    ToolCallDelta(0, 0, "", id="call_golden", name="get_weather"),
    ToolCallDelta(0, 0, '{"city": '),
    ToolCallDelta(0, 0, '"Paris"}'),
]


def encoder(**options):
    counter = itertools.count()
    return ResponseEncoder(
        response_id="resp_golden",
        created_at=1700000000,
        model="SmolLM2",
        settings=SETTINGS,
        new_id=lambda prefix: f"{prefix}_{next(counter)}",
        **options,
    )


def events_of(backend_events, *, failure=None, **options):
    """Every event a stream carries for ``backend_events``, and the encoder."""
    enc = encoder(**options)
    events = enc.opening()
    for event in backend_events:
        events += enc.encode(event)
    events += enc.closing() if failure is None else enc.failing(failure)
    return events, enc


def types(events):
    return [event["type"] for event in events]


CASES = {
    "responses_text": HELLO,
    "responses_tool_call": [*WEATHER_CALL, Finish(0, "tool_calls"), USAGE],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_stream_matches_golden_transcript(name, request):
    events, _ = events_of(CASES[name])
    produced = b"".join(sse_event(event) for event in events)
    path = GOLDEN / f"{name}.sse"
    if request.config.getoption("--update-golden"):
        path.write_bytes(produced)
    assert produced == path.read_bytes()


def test_a_text_answer_streams_in_openais_order():
    events, _ = events_of(HELLO)
    assert types(events) == TWO_DELTAS
    assert [event["sequence_number"] for event in events] == list(range(len(events)))


def test_every_event_is_framed_with_its_type_on_an_event_line():
    event = {"type": "response.output_text.delta", "sequence_number": 4, "delta": "Hi"}
    assert sse_event(event) == (
        b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
        b'"sequence_number":4,"delta":"Hi"}\n\n'
    )


def test_the_final_event_carries_the_whole_response():
    events, enc = events_of(HELLO)
    final = events[-1]["response"]
    assert final == enc.response()
    assert final["status"] == "completed"
    (message,) = final["output"]
    assert message["status"] == "completed"
    assert message["content"] == [
        {"type": "output_text", "annotations": [], "logprobs": [], "text": "Hello!"}
    ]
    assert final["usage"] == {
        "input_tokens": 9,
        "input_tokens_details": {"cached_tokens": 2},
        "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 12,
    }
    assert final["store"] is True  # the settings are repeated


def test_created_and_in_progress_carry_the_response_still_empty():
    events, _ = events_of(HELLO)
    for event in events[:2]:
        assert event["response"]["status"] == "in_progress"
        assert event["response"]["output"] == []
        assert event["response"]["usage"] is None
    added = events[2]["item"]
    assert (added["status"], added["content"]) == ("in_progress", [])


def test_a_tool_call_streams_its_arguments_then_is_done_with_its_name():
    events, enc = events_of([*WEATHER_CALL, Finish(0, "tool_calls"), USAGE])
    assert types(events)[2:] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    done = events[5]
    assert (done["name"], done["arguments"]) == ("get_weather", '{"city": "Paris"}')
    (call,) = enc.response()["output"]
    assert call == {
        "id": "fc_0",
        "type": "function_call",
        "call_id": "call_golden",
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
        "status": "completed",
    }


AGENTS = ToolNames.of(["close"], [("agents", ["close", "spawn"])])


@pytest.mark.parametrize("streaming", [True, False])
def test_a_call_of_a_namespaces_function_is_given_back_with_its_namespace(streaming):
    events, enc = events_of(
        [
            ToolCallDelta(0, 0, '{"id":', id="call_1", name="agents__close"),
            ToolCallDelta(0, 0, "1}"),
            ToolCallDelta(0, 1, "{}", id="call_2", name="close"),
            Finish(0, "tool_calls"),
        ],
        names=AGENTS,
        streaming=streaming,
    )
    namespaced, own = enc.response()["output"]
    assert namespaced == {
        "id": "fc_0",
        "type": "function_call",
        "call_id": "call_1",
        "name": "close",
        "namespace": "agents",
        "arguments": '{"id":1}',
        "status": "completed",
    }
    assert (own["name"], "namespace" in own) == ("close", False)  # the client's own close
    added, done = (
        [event["item"] for event in events if event["type"] == kind and event["output_index"] == 0]
        for kind in ("response.output_item.added", "response.output_item.done")
    )
    assert [(item["name"], item["namespace"]) for item in added + done] == [("close", "agents")] * 2
    assert events[-1]["response"]["output"][0] == namespaced


def test_text_then_two_calls_are_three_items_each_done_before_the_next():
    events, enc = events_of(
        [
            TextDelta(0, "Let me look."),
            *WEATHER_CALL,
            ToolCallDelta(0, 1, "{}", id="call_2", name="get_time"),
            Finish(0, "tool_calls"),
            USAGE,
        ]
    )
    opened_and_done = [
        (event["type"], event["output_index"])
        for event in events
        if event["type"] in ("response.output_item.added", "response.output_item.done")
    ]
    assert opened_and_done == [
        ("response.output_item.added", 0),
        ("response.output_item.done", 0),
        ("response.output_item.added", 1),
        ("response.output_item.done", 1),
        ("response.output_item.added", 2),
        ("response.output_item.done", 2),
    ]
    assert [item["type"] for item in enc.response()["output"]] == [
        "message",
        "function_call",
        "function_call",
    ]


def test_a_call_interleaved_with_another_keeps_every_fragment():
    _, enc = events_of(
        [
            ToolCallDelta(0, 0, '{"a":', id="call_1", name="one"),
            ToolCallDelta(0, 1, '{"b":', id="call_2", name="two"),
            ToolCallDelta(0, 0, "1}"),
            ToolCallDelta(0, 1, "2}"),
            Finish(0, "tool_calls"),
        ]
    )
    assert [item["arguments"] for item in enc.response()["output"]] == ['{"a":1}', '{"b":2}']


@pytest.mark.parametrize(
    ("reason", "why"), [("length", "max_output_tokens"), ("content_filter", "content_filter")]
)
def test_a_cut_answer_is_incomplete_with_the_reason(reason, why):
    events, enc = events_of([TextDelta(0, "Hel"), Finish(0, reason), USAGE])
    assert events[-1]["type"] == "response.incomplete"
    response = enc.response()
    assert (response["status"], response["incomplete_details"]) == ("incomplete", {"reason": why})
    assert response["output"][0]["status"] == "incomplete"


def test_an_answer_of_nothing_is_one_empty_message():
    events, enc = events_of([Finish(0, "stop"), USAGE])
    assert "response.output_text.delta" not in types(events)
    assert enc.response()["output"][0]["content"][0]["text"] == ""


def test_a_failure_midway_ends_with_response_failed_and_what_was_said():
    error = APIError("upstream broke", status=502, type="server_error")
    events, enc = events_of([TextDelta(0, "Hel")], failure=error)
    assert types(events)[-1] == "response.failed"
    response = events[-1]["response"]
    assert response == enc.response()
    assert response["status"] == "failed"
    assert response["error"] == {"code": "server_error", "message": "upstream broke"}
    assert response["output"][0]["status"] == "incomplete"
    assert response["output"][0]["content"][0]["text"] == "Hel"


def test_a_refused_rate_is_a_failed_response_with_the_rate_code():
    error = APIError("Rate limit reached", status=429, code="rate_limit_exceeded")
    events, _ = events_of([], failure=error)
    assert events[-1]["response"]["error"]["code"] == "rate_limit_exceeded"


def test_other_choices_of_an_aliass_default_n_are_left_out():
    _, enc = events_of([TextDelta(0, "A"), TextDelta(1, "B"), Finish(1, "stop"), Finish(0, "stop")])
    (message,) = enc.response()["output"]
    assert message["content"][0]["text"] == "A"


def test_the_frames_are_json_each_on_one_data_line():
    events, _ = events_of(HELLO)
    for event in events:
        kind, data, end = sse_event(event).split(b"\n", 2)
        assert kind == b"event: " + event["type"].encode()
        assert orjson.loads(data.removeprefix(b"data: ")) == event
        assert end == b"\n"
