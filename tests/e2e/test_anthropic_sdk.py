"""The real ``anthropic`` Python SDK against a real daphne serving the embedded model
through ``/v1/messages``: created, streamed and accumulated by the SDK's own helper,
a tool round trip, tokens counted by the model's tokenizer, and each error the SDK
maps to its exception class."""

import anthropic
import pytest

pytestmark = pytest.mark.e2e

MODEL = "smollm2"
ASK = [{"role": "user", "content": "Name three colors."}]
GREEDY = {"temperature": 0}  # the SDK no longer types sampling parameters: sent as extra body
WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@pytest.fixture
def claude(daphne_server):
    """The SDK as its users set it up: a base URL and a key (which this version sends as
    ``Authorization: Bearer``, earlier ones as ``x-api-key``)."""
    with anthropic.Anthropic(
        base_url=daphne_server.url, api_key=daphne_server.key, max_retries=0
    ) as sdk:
        yield sdk


def test_create_answers_a_message_with_its_usage(claude, daphne_server):
    message = claude.messages.create(model="SmolLM2", max_tokens=8, messages=ASK, extra_body=GREEDY)
    assert isinstance(message, anthropic.types.Message)
    assert message.model == "SmolLM2"
    assert message.id.startswith("msg_")
    (block,) = message.content
    assert block.type == "text"
    assert block.text.strip()
    assert message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 8
    assert message.usage.input_tokens > 0
    (row,) = daphne_server.written_rows(completion_id=message.id)
    assert (row["endpoint"], row["status_code"], row["completion_tokens"]) == ("messages", 200, 8)


def test_the_stream_helper_accumulates_what_create_answers(claude):
    params = {"model": MODEL, "max_tokens": 40, "messages": ASK, "extra_body": GREEDY}
    with claude.messages.stream(**params) as stream:
        texts = list(stream.text_stream)
        streamed = stream.get_final_message()
    plain = claude.messages.create(**params)
    assert "".join(texts) == streamed.content[0].text == plain.content[0].text
    assert streamed.stop_reason == plain.stop_reason
    assert streamed.usage.output_tokens == plain.usage.output_tokens
    assert streamed.usage.input_tokens == plain.usage.input_tokens


def test_a_tool_round_trip(claude):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    called = claude.messages.create(
        model=MODEL, max_tokens=64, messages=ask, tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"}, extra_body=GREEDY,
    )  # fmt: skip
    (use,) = [block for block in called.content if block.type == "tool_use"]
    assert use.name == "get_weather"
    assert isinstance(use.input["city"], str)
    assert called.stop_reason == "tool_use"
    answered = claude.messages.create(
        model=MODEL,
        max_tokens=16,
        tools=[WEATHER],
        messages=[
            *ask,
            {"role": "assistant", "content": called.content},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 24C"}
                ],
            },
        ],
        extra_body=GREEDY,
    )
    assert answered.content[0].type == "text"
    assert answered.content[0].text.strip()


def test_count_tokens_is_the_models_own_count_of_the_prompt(claude):
    params = {"model": MODEL, "messages": ASK, "system": "Answer briefly."}
    counted = claude.messages.count_tokens(**params)
    answered = claude.messages.create(max_tokens=1, **params)
    usage = answered.usage  # Anthropic's input: read from the cache, written to it, the rest
    prompt = usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
    assert counted.input_tokens == prompt


def test_a_key_in_x_api_key_as_earlier_sdks_send_it(daphne_server):
    headers = {"X-Api-Key": daphne_server.key}
    with anthropic.Anthropic(
        base_url=daphne_server.url, api_key=None, default_headers=headers, max_retries=0
    ) as sdk:
        message = sdk.messages.create(model=MODEL, max_tokens=1, messages=ASK)
    assert message.usage.output_tokens == 1


def test_errors_are_the_sdks_exceptions_with_a_request_id(claude, daphne_server):
    with (
        anthropic.Anthropic(
            base_url=daphne_server.url, api_key="sk-wrong-0000", max_retries=0
        ) as wrong,
        pytest.raises(anthropic.AuthenticationError) as raised,
    ):
        wrong.messages.create(model=MODEL, max_tokens=4, messages=ASK)
    assert raised.value.body["error"]["type"] == "authentication_error"
    assert raised.value.request_id.startswith("req_")
    with pytest.raises(anthropic.NotFoundError) as raised:
        claude.messages.create(model="claude-nope", max_tokens=4, messages=ASK)
    assert raised.value.body["type"] == "error"
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}
    with pytest.raises(anthropic.BadRequestError, match="'image' content blocks are not supported"):
        claude.messages.create(
            model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [image]}]
        )


def test_a_rate_limit_is_the_sdks_rate_limit_error(daphne_server):
    plaintext = daphne_server.manage(
        "shell",
        "-c",
        "from chatparity.models import ApiKey;"
        " print(ApiKey.objects.create_key('sdk-limited', requests_per_minute=1)[1])",
    ).splitlines()[-1]  # after what the shell says of itself
    with anthropic.Anthropic(base_url=daphne_server.url, api_key=plaintext, max_retries=0) as sdk:
        sdk.messages.create(model=MODEL, max_tokens=1, messages=ASK)
        with pytest.raises(anthropic.RateLimitError) as raised:
            sdk.messages.create(model=MODEL, max_tokens=1, messages=ASK)
    assert raised.value.body["error"]["type"] == "rate_limit_error"
    assert int(raised.value.response.headers["retry-after"]) >= 1
