"""CompletionAccumulator: a non-stream response is the accumulated stream."""

from pathlib import Path

import orjson
import pytest

from chatparity.protocol.completion import CompletionAccumulator

GOLDEN = Path(__file__).parent / "golden"


def accumulate(name):
    accumulator = CompletionAccumulator()
    for frame in (GOLDEN / f"{name}.sse").read_bytes().split(b"\n\n"):
        if frame.startswith(b"data: {"):
            accumulator.add(orjson.loads(frame[6:]))
    return accumulator.completion()


def test_text_stream_folds_into_the_canonical_completion():
    assert accumulate("text_with_usage") == {
        "id": "chatcmpl-golden",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "SmolLM2",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Hello!",
                    "refusal": None,
                    "annotations": [],
                },
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 9,
            "completion_tokens": 3,
            "total_tokens": 12,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        },
        "service_tier": "default",
        "system_fingerprint": "fp_golden",
    }


def test_key_order_is_openais():
    completion = accumulate("text_with_usage")
    assert list(completion) == [
        *("id", "object", "created", "model", "choices", "usage"),
        *("service_tier", "system_fingerprint"),
    ]
    assert list(completion["choices"][0]) == ["index", "message", "logprobs", "finish_reason"]


def test_tool_call_arguments_are_concatenated_and_content_is_null():
    (choice,) = accumulate("tool_call")["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_golden",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
        "refusal": None,
        "annotations": [],
    }


def test_a_deprecated_function_call_folds_into_message_function_call():
    (choice,) = accumulate("function_call")["choices"]
    assert choice["finish_reason"] == "function_call"
    assert choice["message"] == {
        "role": "assistant",
        "content": None,
        "function_call": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        "refusal": None,
        "annotations": [],
    }


def test_interleaved_choices_are_grouped_by_index():
    choices = accumulate("two_choices_interleaved")["choices"]
    assert [(c["index"], c["message"]["content"], c["finish_reason"]) for c in choices] == [
        (0, "Aa", "stop"),
        (1, "Bb", "length"),
    ]


def test_logprobs_are_collected_per_choice():
    (choice,) = accumulate("logprobs")["choices"]
    assert choice["logprobs"] == {
        "content": [
            {
                "token": "Hi",
                "logprob": -0.25,
                "bytes": [72, 105],
                "top_logprobs": [{"token": "Hi", "logprob": -0.25, "bytes": [72, 105]}],
            }
        ],
        "refusal": None,
    }


@pytest.mark.parametrize("name", ["text_without_usage", "empty_answer"])
def test_empty_or_usage_free_streams_still_fold(name):
    (choice,) = accumulate(name)["choices"]
    assert choice["finish_reason"] == "stop"
    assert isinstance(choice["message"]["content"], str)
