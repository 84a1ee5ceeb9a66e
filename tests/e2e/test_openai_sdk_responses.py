"""The real openai-python SDK's Responses API against a real daphne serving the embedded
model: create, stream (both ways), parse, retrieve, delete, input items, continue."""

import json

import openai
import pydantic
import pytest

from tests.e2e.test_openai_sdk import WEATHER as CHAT_WEATHER

pytestmark = pytest.mark.e2e

WEATHER = {"type": "function", **CHAT_WEATHER["function"]}  # the Responses API's shape
BRIEF = {"model": "smollm2", "input": "Name three colors.", "temperature": 0}


class Person(pydantic.BaseModel):
    name: str
    age: int


def test_create_answers_text_with_usage_and_leaves_a_responses_row(client, daphne_server):
    response = client.responses.create(**BRIEF, max_output_tokens=40)
    assert response.id.startswith("resp_")
    assert (response.object, response.model) == ("response", "smollm2")
    assert response.status in ("completed", "incomplete")
    assert response.output_text.strip()
    assert 0 < response.usage.output_tokens <= 40
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    (row,) = daphne_server.written_rows(completion_id=response.id)
    assert (row["endpoint"], row["status_code"]) == ("responses", 200)
    assert row["completion_tokens"] == response.usage.output_tokens


def test_a_streamed_response_is_the_same_as_the_created_one(client):
    plain = client.responses.create(**BRIEF, max_output_tokens=40)
    events = list(client.responses.create(**BRIEF, max_output_tokens=40, stream=True))
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert events[0].type == "response.created"
    assert events[-1].type in ("response.completed", "response.incomplete")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert text == final.output_text == plain.output_text
    assert final.usage.output_tokens == plain.usage.output_tokens


def test_the_stream_helper_gives_the_final_response(client):
    with client.responses.stream(**BRIEF, max_output_tokens=60) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text
    assert final.status == "completed"


def test_parse_fills_a_pydantic_model(client):
    response = client.responses.parse(
        model="smollm2",
        input="Invent a person.",
        text_format=Person,
        temperature=0,
        max_output_tokens=60,
    )
    person = response.output_parsed
    assert isinstance(person, Person)
    assert isinstance(person.age, int)


def test_a_required_tool_is_called_with_json_arguments(client):
    response = client.responses.create(
        model="smollm2",
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice="required",
        max_output_tokens=60,
    )
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert call.name == "get_weather"
    assert call.call_id.startswith("call_")
    assert isinstance(json.loads(call.arguments)["city"], str)
    answered = client.responses.create(
        model="smollm2",
        previous_response_id=response.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}],
        max_output_tokens=30,
    )
    assert answered.output_text.strip()


def test_retrieve_list_input_items_continue_and_delete(client):
    first = client.responses.create(model="smollm2", input="My name is Ada.", max_output_tokens=20)
    assert client.responses.retrieve(first.id).output_text == first.output_text
    items = client.responses.input_items.list(first.id)
    assert [item.content[0].text for item in items.data] == ["My name is Ada."]
    second = client.responses.create(
        model="smollm2",
        input="What is my name?",
        previous_response_id=first.id,
        max_output_tokens=20,
    )
    assert second.previous_response_id == first.id
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError) as gone:
        client.responses.create(model="smollm2", input="Hi", previous_response_id=first.id)
    assert gone.value.code == "previous_response_not_found"


def test_errors_raise_the_sdks_typed_exceptions(client):
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model="smollm2", input="Hi", temperature=5, stream=True)
    assert bad.value.param == "temperature"
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model="nope", input="Hi")
    assert missing.value.code == "model_not_found"
