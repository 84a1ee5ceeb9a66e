"""OpenAI's errors, worded as OpenAI words them."""

import pytest

from chatparity.protocol.errors import context_length_exceeded


@pytest.mark.parametrize(
    ("completion", "at_least", "message"),
    [
        (
            1000,
            False,
            "This model's maximum context length is 8192 tokens. However, you requested 1018"
            " tokens (18 in the messages, 1000 in the completion). Please reduce the length of"
            " the messages or completion.",
        ),
        (
            None,
            False,
            "This model's maximum context length is 8192 tokens. However, your messages resulted"
            " in 18 tokens. Please reduce the length of the messages.",
        ),
        (
            1000,
            True,
            "This model's maximum context length is 8192 tokens. However, you requested at least"
            " 1018 tokens (at least 18 in the messages, 1000 in the completion). Please reduce"
            " the length of the messages or completion.",
        ),
        (
            None,
            True,
            "This model's maximum context length is 8192 tokens. However, your messages resulted"
            " in at least 18 tokens. Please reduce the length of the messages.",
        ),
    ],
    ids=["a completion asked", "no completion asked", "a bound, completion", "a bound"],
)
def test_a_context_overflow_is_worded_as_openai_words_it(completion, at_least, message):
    error = context_length_exceeded(8192, 18, completion, at_least=at_least)
    assert (error.status, error.param, error.code, error.message) == (
        400,
        "messages",
        "context_length_exceeded",
        message,
    )
    counts = (error.limit, error.prompt_tokens, error.completion_tokens)
    assert counts == (8192, 18, completion or 0)
