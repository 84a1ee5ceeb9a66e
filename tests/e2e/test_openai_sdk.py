"""The real openai-python SDK against a real daphne serving the embedded model."""

import json

import openai
import pytest

pytestmark = pytest.mark.e2e

ASK = [{"role": "user", "content": "Tell me a long story about a dragon."}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def test_streaming_iteration_yields_real_text_and_usage(client, daphne_server):
    stream = client.chat.completions.create(
        model="smollm2", messages=ASK, stream=True, temperature=0, max_tokens=12,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 12
    assert {c.id for c in chunks} == {chunks[0].id}
    (row,) = daphne_server.written_rows(completion_id=chunks[0].id)
    assert (row["status_code"], row["completion_tokens"], row["stream"]) == (200, 12, 1)


def test_stream_helper_accumulates_the_same_text_as_non_stream(client):
    short = [{"role": "user", "content": "Name three colors."}]
    params = {"model": "smollm2", "messages": short, "temperature": 0, "max_tokens": 40}
    try:
        with client.chat.completions.stream(**params) as stream:
            for _ in stream:
                pass
            streamed = stream.get_final_completion()
    except openai.LengthFinishReasonError as cut:  # the helper refuses an answer cut short
        streamed = cut.completion
    plain = client.chat.completions.create(**params)
    assert streamed.choices[0].message.content == plain.choices[0].message.content
    assert streamed.choices[0].finish_reason == plain.choices[0].finish_reason
    assert streamed.choices[0].message.content.strip()
    # Whichever way the model ends, it is said as it happened: cut at max_tokens, or before.
    finish, used = plain.choices[0].finish_reason, plain.usage.completion_tokens
    assert (finish, used) == ("length", 40) or (finish == "stop" and 0 < used < 40)
    assert plain.model == "smollm2"


def test_model_echoes_what_the_client_sent(client):
    reply = client.chat.completions.create(model="SmolLM2", messages=ASK, max_tokens=1)
    assert reply.model == "SmolLM2"


def test_n_choices_each_with_one_finisher(client):
    stream = client.chat.completions.create(
        model="smollm2", messages=ASK, stream=True, n=2, max_tokens=4, temperature=0.7, seed=1
    )
    finishes = {}
    for chunk in stream:
        for choice in chunk.choices:
            if choice.finish_reason:
                assert choice.index not in finishes
                finishes[choice.index] = choice.finish_reason
    assert finishes == {0: "length", 1: "length"}


def test_forced_tool_call_streams_valid_json_arguments(client):
    with client.chat.completions.stream(
        model="smollm2",
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER],
        tool_choice="required",
        temperature=0,
        max_tokens=60,
    ) as stream:
        for _ in stream:
            pass
        completion = stream.get_final_completion()
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert call.id.startswith("call_")
    assert isinstance(json.loads(call.function.arguments)["city"], str)


def test_json_schema_output_parses(client):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    reply = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Invent a person."}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": schema},
        },
        temperature=0,
        max_tokens=60,
    )
    person = json.loads(reply.choices[0].message.content)
    assert set(person) == {"name", "age"}
    assert isinstance(person["age"], int)


def test_errors_raise_the_sdks_typed_exceptions(client, daphne_server):
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="nope", messages=ASK)
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="smollm2", messages=ASK, temperature=5, stream=True)
    assert bad.value.param == "temperature"
    wrong = openai.OpenAI(base_url=daphne_server.base_url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as denied:
        wrong.chat.completions.create(model="smollm2", messages=ASK)
    assert denied.value.code == "invalid_api_key"


def test_models_list_and_retrieve(client):
    assert "smollm2" in [m.id for m in client.models.list()]
    model = client.models.retrieve("smollm2")
    assert (model.id, model.object) == ("smollm2", "model")
