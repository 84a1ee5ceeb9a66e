"""ChunkEncoder: backend events become OpenAI's exact chunk stream.

Each case scripts the events a backend yields and compares the SSE bytes with
a golden transcript in ``golden/``, written in the shape of streams recorded
from the real API. Run with ``--update-golden`` to rewrite them after an
intended change, then review the diff.
"""

from pathlib import Path

import orjson
import pytest

from chatparity.protocol.errors import APIError
from chatparity.protocol.events import (
    Finish,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Usage,
)
from chatparity.protocol.stream import DONE, ChunkEncoder, error_frame, sse
from chatparity.protocol.upstream import ChunkReader, ServerSentEvent

GOLDEN = Path(__file__).parent / "golden"


def encoder(**options):
    return ChunkEncoder(
        completion_id="chatcmpl-golden",
        created=1700000000,
        model="SmolLM2",
        system_fingerprint="fp_golden",
        **options,
    )


def transcript(events, **options):
    enc = encoder(**options)
    frames = [sse(chunk) for event in events for chunk in enc.encode(event)]
    return b"".join(frames) + DONE


USAGE = Usage(prompt_tokens=9, completion_tokens=3)
HELLO = [TextDelta(0, "Hel"), TextDelta(0, "lo!"), Finish(0, "stop"), USAGE]
LOGPROB = TokenLogprob(
    token="Hi", logprob=-0.25, bytes=[72, 105], top_logprobs=[TopLogprob("Hi", -0.25, [72, 105])]
)
CALL = [
    ToolCallDelta(0, 0, "", id="call_golden", name="get_weather"),
    ToolCallDelta(0, 0, '{"city": '),
    ToolCallDelta(0, 0, '"Paris"}'),
    Finish(0, "tool_calls"),
    USAGE,
]

CASES = {
    "text_without_usage": (HELLO, {}),
    "text_with_usage": (HELLO, {"include_usage": True}),
    "two_choices_interleaved": (
        [
            TextDelta(0, "A"),
            TextDelta(1, "B"),
            TextDelta(1, "b"),
            TextDelta(0, "a"),
            Finish(1, "length"),
            Finish(0, "stop"),
            Usage(prompt_tokens=9, completion_tokens=4),
        ],
        {"include_usage": True},
    ),
    "tool_call": (CALL, {}),
    "function_call": (CALL, {"legacy_functions": True, "include_usage": True}),
    "logprobs": (
        [TextDelta(0, "Hi", logprobs=[LOGPROB]), Finish(0, "stop"), USAGE],
        {"logprobs": True},
    ),
    "empty_answer": ([Finish(0, "stop"), USAGE], {"include_usage": True}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_stream_matches_golden_transcript(name, request):
    events, options = CASES[name]
    produced = transcript(events, **options)
    path = GOLDEN / f"{name}.sse"
    if request.config.getoption("--update-golden"):
        path.write_bytes(produced)
    assert produced == path.read_bytes()


def test_every_chunk_shares_id_created_model_and_fingerprint():
    enc = encoder(include_usage=True)
    chunks = [chunk for event in HELLO for chunk in enc.encode(event)]
    envelopes = {
        (c["id"], c["object"], c["created"], c["model"], c["system_fingerprint"], c["service_tier"])
        for c in chunks
    }
    assert envelopes == {
        ("chatcmpl-golden", "chat.completion.chunk", 1700000000, "SmolLM2", "fp_golden", "default")
    }


def test_role_chunk_opens_each_choice_once_and_finisher_closes_it():
    enc = encoder()
    events = [
        TextDelta(0, "a"),
        TextDelta(1, "b"),
        TextDelta(0, "c"),
        Finish(0, "stop"),
        Finish(1, "stop"),
    ]
    deltas = [
        (c["choices"][0]["index"], c["choices"][0]["delta"]) for e in events for c in enc.encode(e)
    ]
    for index in (0, 1):
        mine = [delta for i, delta in deltas if i == index]
        assert mine[0] == {"role": "assistant", "content": "", "refusal": None}
        assert mine[-1] == {}
        assert all("role" not in delta for delta in mine[1:])


def test_usage_null_on_every_chunk_only_when_usage_was_requested():
    with_usage = [c for e in HELLO for c in encoder(include_usage=True).encode(e)]
    assert [c["usage"] for c in with_usage[:-1]] == [None] * (len(with_usage) - 1)
    assert with_usage[-1]["choices"] == []
    assert with_usage[-1]["usage"]["total_tokens"] == 12
    without = [c for e in HELLO for c in encoder().encode(e)]
    assert len(without) == len(with_usage) - 1
    assert all("usage" not in chunk for chunk in without)


def test_intermediate_chunks_carry_null_finish_reason_and_logprobs():
    chunks = [c for e in HELLO[:-1] for c in encoder().encode(e)]
    for chunk in chunks[:-1]:
        (choice,) = chunk["choices"]
        assert list(choice) == ["index", "delta", "logprobs", "finish_reason"]
        assert choice["finish_reason"] is None
        assert choice["logprobs"] is None


def test_error_frame_is_the_bare_error_envelope():
    error = APIError("boom", status=500, type="server_error", code="x")
    frame = error_frame(error)
    assert frame.startswith(b"data: ")
    assert frame.endswith(b"\n\n")
    assert orjson.loads(frame[6:]) == {
        "error": {"message": "boom", "type": "server_error", "param": None, "code": "x"}
    }


def test_a_deprecated_function_call_carries_the_first_call_only():
    enc = encoder(legacy_functions=True)
    events = [
        ToolCallDelta(0, 0, '{"city": "Paris"}', id="call_a", name="get_weather"),
        ToolCallDelta(0, 1, "", id="call_b", name="get_time"),
        ToolCallDelta(0, 1, "{}"),
        Finish(0, "tool_calls"),
    ]
    deltas = [chunk["choices"][0]["delta"] for event in events for chunk in enc.encode(event)]
    assert deltas == [
        {
            "role": "assistant",
            "content": None,
            "function_call": {"name": "get_weather", "arguments": ""},
            "refusal": None,
        },
        {"function_call": {"arguments": '{"city": "Paris"}'}},
        {},
    ]


@pytest.mark.parametrize(("reason", "sent"), [("tool_calls", "function_call"), ("stop", "stop")])
def test_a_deprecated_function_call_finishes_with_function_call_unless_named(reason, sent):
    (chunk,) = encoder(legacy_functions=True).encode(Finish(0, reason))[1:]
    assert chunk["choices"][0]["finish_reason"] == sent


def test_text_answers_to_deprecated_functions_are_plain_text():
    legacy = [c for e in HELLO for c in encoder(legacy_functions=True).encode(e)]
    assert legacy == [c for e in HELLO for c in encoder().encode(e)]


def upstream_chunk(delta, finish_reason=None):
    choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
    return ServerSentEvent("message", orjson.dumps({"choices": [choice]}).decode())


def test_an_upstreams_tool_call_reaches_a_client_of_functions_as_function_call():
    # The answer of an upstream sent functions_as_tools(request), read and encoded again.
    reader = ChunkReader(n=1, prompt_tokens=9)
    opening = {"index": 0, "id": "call_up", "type": "function", "function": {"name": "f"}}
    sent = [
        upstream_chunk({"role": "assistant", "tool_calls": [opening]}),
        upstream_chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
        upstream_chunk({}, "tool_calls"),
    ]
    enc = encoder(legacy_functions=True)
    chunks = [chunk for sse in sent for event in reader.read(sse) for chunk in enc.encode(event)]
    assert [chunk["choices"][0]["delta"] for chunk in chunks] == [
        {
            "role": "assistant",
            "content": None,
            "function_call": {"name": "f", "arguments": ""},
            "refusal": None,
        },
        {"function_call": {"arguments": "{}"}},
        {},
    ]
    assert chunks[-1]["choices"][0]["finish_reason"] == "function_call"
