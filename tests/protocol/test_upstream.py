"""Reading upstream streams: server-sent events and chunks, quirks repaired."""

import json

import pytest

from chatparity.protocol.errors import APIError
from chatparity.protocol.events import Finish, ReasoningDelta, TextDelta, ToolCallDelta, Usage
from chatparity.protocol.upstream import (
    MAX_REPORTED_TOKENS,
    ChunkReader,
    ServerSentEvent,
    SSEReader,
    UpstreamError,
    believable_usage,
    retry_after,
    upstream_error,
)


def sse_events(*lines):
    reader = SSEReader()
    events = [reader.feed(line) for line in lines]
    return [e for e in [*events, reader.flush()] if e is not None]


def message(payload):
    return ServerSentEvent("message", json.dumps(payload))


class TestSSEReader:
    def test_comments_and_blank_lines_are_not_events(self):
        assert sse_events(": keepalive", "", "") == []

    def test_data_lines_join_with_newlines_and_the_space_is_optional(self):
        assert sse_events("data: a", "data:b", "") == [ServerSentEvent("message", "a\nb")]

    def test_event_names_are_kept(self):
        assert sse_events("event: error", 'data: {"error": {}}', "") == [
            ServerSentEvent("error", '{"error": {}}')
        ]

    def test_an_event_without_its_blank_line_is_flushed_at_the_end(self):
        assert sse_events("data: [DONE]") == [ServerSentEvent("message", "[DONE]")]

    def test_an_event_over_the_limit_is_malformed_however_many_lines_make_it(self):
        reader = SSEReader(limit=10)
        assert reader.feed("data: 12345") is None
        with pytest.raises(UpstreamError) as raised:
            reader.feed("data: 67890")
        assert raised.value.status == 502


class TestChunkReader:
    def test_done_ends_the_stream(self):
        reader = ChunkReader(n=1, prompt_tokens=3)
        assert reader.read(ServerSentEvent("message", "[DONE]")) == []
        assert reader.done

    def test_open_choices_are_closed_and_usage_counted_when_the_upstream_sends_none(self):
        reader = ChunkReader(n=2, prompt_tokens=3)
        reader.read(message({"choices": [{"index": 0, "delta": {"content": "a"}}]}))
        reader.read(message({"choices": [{"index": 0, "delta": {"content": "b"}}]}))
        assert reader.unseen() == [1]
        assert reader.close(reader.indices) == [Finish(0, "stop"), Finish(1, "stop")]
        assert reader.close([0]) == []  # a choice finishes once
        assert reader.usage == Usage(3, 2, counted=True)

    def test_reasoning_as_servers_name_it_is_read_and_counted(self):
        reader = ChunkReader(n=1, prompt_tokens=3)
        thought = {"choices": [{"index": 0, "delta": {"reasoning_content": "Hm, "}}]}
        said = {"choices": [{"index": 0, "delta": {"reasoning": "a greeting.", "content": "Hi"}}]}
        assert reader.read(message(thought)) + reader.read(message(said)) == [
            ReasoningDelta(0, "Hm, "),
            ReasoningDelta(0, "a greeting."),
            TextDelta(0, "Hi"),
        ]
        odd = {"choices": [{"index": 0, "delta": {"reasoning": {"summary": "x"}}}]}
        assert reader.read(message(odd)) == []  # not text: not reasoning we can show
        assert reader.usage == Usage(3, 3, counted=True)

    def test_a_choice_asked_for_on_its_own_is_renumbered(self):
        reader = ChunkReader(n=1, prompt_tokens=0, first_index=2)
        chunk = {"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": "stop"}]}
        assert reader.read(message(chunk)) == [TextDelta(2, "x"), Finish(2, "stop")]
        assert reader.unseen() == []

    def test_upstream_usage_wins_over_counting_wherever_it_comes(self):
        reader = ChunkReader(n=1, prompt_tokens=3)
        usage = {
            "prompt_tokens": 9,
            "completion_tokens": 4,
            "prompt_tokens_details": {"cached_tokens": 2},
            "completion_tokens_details": {"reasoning_tokens": 1},
        }
        chunk = {"choices": [{"index": 0, "delta": {"content": "hi"}}], "usage": usage}
        assert reader.read(message(chunk)) == [TextDelta(0, "hi")]
        assert reader.usage == Usage(9, 4, cached_tokens=2, reasoning_tokens=1)

    @pytest.mark.parametrize(
        "usage",
        [
            {"prompt_tokens": 9, "completion_tokens": -5},
            {"prompt_tokens": 9, "completion_tokens": 3_000_000_000},
            {"prompt_tokens": 9, "completion_tokens": 1.5},
            {"prompt_tokens": 9, "completion_tokens": 1e300},
            {"prompt_tokens": 9, "completion_tokens": True},
            {"prompt_tokens": "\N{SUPERSCRIPT TWO}", "completion_tokens": 2},  # isdigit() says yes
            {"prompt_tokens": "9" * 5000, "completion_tokens": 2},  # int() refuses
            {"prompt_tokens": 9},
            {"prompt_tokens": 9, "completion_tokens": 2, "prompt_tokens_details": [1]},
            {"prompt_tokens": 9, "completion_tokens": 2,
             "completion_tokens_details": {"reasoning_tokens": -1}},
            {"prompt_tokens": 9, "completion_tokens": 2,
             "prompt_tokens_details": {"cached_tokens": 10}},
            {"prompt_tokens": 9, "completion_tokens": 2,
             "prompt_tokens_details": {"cached_tokens": -1}},
            {"prompt_tokens": 9, "completion_tokens": 2,
             "prompt_tokens_details": {"cached_tokens": 5, "cache_write_tokens": 5}},
        ],
        ids=[
            "negative", "above-bound", "fraction", "huge-number", "boolean", "superscript",
            "thousands-of-digits", "missing", "details-not-an-object", "negative-detail",
            "more-cached-than-the-prompt", "negative-cached", "more-cache-than-the-prompt",
        ],
    )  # fmt: skip
    def test_usage_that_cannot_be_believed_is_counted_and_kept_for_the_log(self, usage):
        reader = ChunkReader(n=1, prompt_tokens=3)
        chunk = {"choices": [{"index": 0, "delta": {"content": "hi"}}], "usage": usage}
        reader.read(message(chunk))
        assert reader.usage == Usage(3, 1, counted=True)
        assert reader.refused_usage == usage

    def test_cache_reads_and_openrouters_cache_writes_are_read(self):
        details = {"cached_tokens": 6, "cache_write_tokens": 2}
        usage = {"prompt_tokens": 9, "completion_tokens": 4, "prompt_tokens_details": details}
        assert believable_usage(usage, 4) == Usage(
            9, 4, cached_tokens=6, cache_write_5m_tokens=2
        ), "every input token in prompt_tokens, OpenAI's meaning: the cache's among them"

    def test_usage_written_as_integral_numbers_or_digit_strings_is_believed(self):
        usage = {"prompt_tokens": "9", "completion_tokens": 4.0}
        assert believable_usage(usage, MAX_REPORTED_TOKENS) == Usage(9, 4)
        assert believable_usage({**usage, "prompt_tokens": MAX_REPORTED_TOKENS}, 4) is not None

    def test_more_completion_tokens_than_the_request_allowed_are_not_believed(self):
        reader = ChunkReader(n=2, prompt_tokens=3, max_tokens=10)
        allowed = {"prompt_tokens": 9, "completion_tokens": 20}
        reader.read(message({"choices": [], "usage": allowed}))
        assert reader.usage == Usage(9, 20)
        reader.read(message({"choices": [], "usage": {**allowed, "completion_tokens": 21}}))
        assert reader.usage == Usage(3, 0, counted=True)

    def test_unknown_finish_reasons_become_stop(self):
        reader = ChunkReader(n=1, prompt_tokens=0)
        chunk = {"choices": [{"index": 0, "delta": {}, "finish_reason": "eos"}]}
        assert reader.read(message(chunk)) == [Finish(0, "stop")]

    def test_a_tool_call_without_id_gets_one(self):
        reader = ChunkReader(n=1, prompt_tokens=0)
        call = {"index": 0, "function": {"name": "f", "arguments": "{}"}}
        chunk = {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}
        (event,) = reader.read(message(chunk))
        assert isinstance(event, ToolCallDelta)
        assert event.id.startswith("call_")
        assert (event.name, event.arguments) == ("f", "{}")
        assert reader.close([0]) == [Finish(0, "tool_calls")]

    def test_a_named_tool_choice_finishes_with_stop_as_openai_does(self):
        reader = ChunkReader(n=1, prompt_tokens=0, call_finish="stop")
        call = {"index": 0, "id": "c", "function": {"name": "f", "arguments": "{}"}}
        reader.read(message({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}))
        finisher = {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}
        assert reader.read(message(finisher)) == [Finish(0, "stop")]

    def test_logprobs_count_tokens(self):
        reader = ChunkReader(n=1, prompt_tokens=0)
        entries = [{"token": t, "logprob": -0.5, "bytes": None} for t in ("a", "b")]
        chunk = {
            "choices": [{"index": 0, "delta": {"content": "ab"}, "logprobs": {"content": entries}}]
        }
        (event,) = reader.read(message(chunk))
        assert event.tokens == 2
        assert [e.token for e in event.logprobs] == ["a", "b"]

    @pytest.mark.parametrize(
        ("event", "payload"),
        [
            ("error", {"error": {"message": "overloaded", "type": "server_error"}}),
            ("message", {"error": {"message": "overloaded", "type": "server_error"}}),
        ],
    )
    def test_error_events_raise_the_upstream_error(self, event, payload):
        reader = ChunkReader(n=1, prompt_tokens=0)
        with pytest.raises(UpstreamError) as raised:
            reader.read(ServerSentEvent(event, json.dumps(payload)))
        error = raised.value
        assert (error.status, error.type) == (502, "server_error")
        assert error.message == "The upstream model returned an error."
        assert error.upstream_message == "overloaded"

    @pytest.mark.parametrize(
        "choice",
        [
            {"index": 0, "delta": ["a list"]},
            {"index": 0, "delta": {"tool_calls": ["a string"]}},
            {"index": 0, "delta": {"tool_calls": [{"index": [0], "function": {}}]}},
            {"index": 0, "delta": {"tool_calls": [{"function": "f"}]}},
            {"index": 0, "delta": {"content": "a"}, "logprobs": {"content": [{"logprob": "x"}]}},
        ],
        ids=["delta", "call", "call-index", "function", "logprob"],
    )
    def test_a_chunk_with_parts_of_the_wrong_type_is_a_502(self, choice):
        with pytest.raises(UpstreamError) as raised:
            ChunkReader(n=1, prompt_tokens=0).read(message({"choices": [choice]}))
        assert raised.value.status == 502
        assert raised.value.code == "upstream_error"

    def test_malformed_json_is_a_502_that_keeps_what_was_sent_for_the_log(self):
        with pytest.raises(UpstreamError) as raised:
            ChunkReader(n=1, prompt_tokens=0).read(ServerSentEvent("message", "{at 10.0.0.7"))
        error = raised.value
        assert (error.status, error.code) == (502, "upstream_error")
        assert error.message == "The upstream sent a malformed stream: invalid JSON."
        assert (error.detail, error.upstream_message) == ("{at 10.0.0.7", "")


class TestWholeCompletion:
    """A whole ``chat.completion`` read as the stream that would have carried it."""

    def test_each_choice_is_one_delta_and_its_finisher(self):
        reader = ChunkReader(n=2, prompt_tokens=3)
        completion = {
            "choices": [
                {"index": 1, "message": {"content": "Bonjour"}, "finish_reason": "length"},
                {"index": 0, "message": {"role": "assistant", "content": "Hello"}},
            ],
            "usage": {"prompt_tokens": 4, "completion_tokens": 6},
        }
        events = reader.read_completion(json.dumps(completion).encode())
        assert events == [
            TextDelta(1, "Bonjour", tokens=2),
            Finish(1, "length"),
            TextDelta(0, "Hello", tokens=2),
        ]
        assert reader.done
        assert reader.close(reader.indices) == [Finish(0, "stop")]
        assert reader.usage == Usage(4, 6)

    def test_tool_calls_are_numbered_in_order(self):
        reader = ChunkReader(n=1, prompt_tokens=0)
        call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        completion = {"choices": [{"message": {"content": None, "tool_calls": [call, call]}}]}
        events = reader.read_completion(json.dumps(completion).encode())
        assert [(e.call_index, e.id) for e in events] == [(0, "call_1"), (1, "call_1")]

    def test_an_error_envelope_is_the_upstreams_error(self):
        reader = ChunkReader(n=1, prompt_tokens=0)
        body = json.dumps({"error": {"message": "nope", "type": "invalid_request_error"}})
        with pytest.raises(UpstreamError) as raised:
            reader.read_completion(body.encode())
        assert (raised.value.type, raised.value.upstream_message) == (
            "invalid_request_error", "nope",
        )  # fmt: skip

    @pytest.mark.parametrize("body", [b"{not json", b"[1, 2]"])
    def test_anything_else_is_malformed(self, body):
        reader = ChunkReader(n=1, prompt_tokens=0)
        with pytest.raises(APIError) as raised:
            reader.read_completion(body)
        assert raised.value.status == 502


class TestUpstreamError:
    """An upstream's error as clients see it: its status, type and code, our message."""

    def test_the_envelope_keeps_status_type_param_and_code(self):
        error = upstream_error(
            {
                "error": {
                    "message": "This model's maximum context length is 8192 tokens.",
                    "type": "invalid_request_error",
                    "param": "messages.[0].content",
                    "code": "context_length_exceeded",
                }
            },
            status=400,
        )
        assert error.envelope()["error"] == {
            "message": "The upstream model returned an error (status 400, code"
            " 'context_length_exceeded').",
            "type": "invalid_request_error",
            "param": "messages.[0].content",
            "code": "context_length_exceeded",
        }
        assert error.status == 400
        assert error.upstream_message == "This model's maximum context length is 8192 tokens."

    def test_free_text_in_type_param_or_code_is_dropped(self):
        error = upstream_error(
            {"error": {"type": "error at 10.0.0.7", "param": "x y", "code": "no route to host"}},
            status=403,
        )
        assert (error.type, error.param, error.code) == ("invalid_request_error", None, None)
        assert error.message == "The upstream model returned an error (status 403)."

    @pytest.mark.parametrize(("status", "seen"), [(500, 502), (503, 502), (302, 502), (404, 404)])
    def test_clients_get_a_4xx_as_is_and_anything_else_as_502(self, status, seen):
        assert upstream_error({"error": {"message": "x"}}, status=status).status == seen

    @pytest.mark.parametrize(
        "payload", ["<html>proxy 10.0.0.7 says no</html>", {"error": "proxy 10.0.0.7 says no"}]
    )
    def test_what_is_not_an_envelope_is_an_upstream_error_kept_for_the_log(self, payload):
        error = upstream_error(payload, status=500)
        assert error.envelope()["error"] == {
            "message": "The upstream model returned an error (status 500).",
            "type": "server_error",
            "param": None,
            "code": "upstream_error",
        }
        assert "proxy 10.0.0.7 says no" in error.detail


NOW = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after": "5"}, 5.0),
        ({"retry-after": " 2.5 "}, 2.5),
        ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5),  # OpenAI's, more precise
        ({"retry-after-ms": "soon", "retry-after": "9"}, 9.0),
        ({"retry-after": "Tue, 14 Nov 2023 22:13:50 GMT"}, 30.0),
        ({"retry-after": "Tue, 14 Nov 2023 22:13:00 GMT"}, 0.0),  # passed: ask again now
        ({"retry-after": "-3"}, None),
        ({"retry-after": "nan"}, None),
        ({"retry-after": "999999"}, None),  # more than a day: not believed
        ({"retry-after": "whenever"}, None),
        ({"retry-after": "Tue, 14 Nov 2023 22:13:50"}, None),  # no zone: no moment
        ({}, None),
    ],
)
def test_an_upstreams_retry_after_is_read_in_seconds(headers, seconds):
    assert retry_after(headers, now=NOW) == seconds
