"""LangChain's ChatOpenAI against a real daphne serving the embedded model, set up with
a base URL, a key and a model only."""

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

pytestmark = pytest.mark.e2e


@pytest.fixture
def chat(daphne_server):
    return ChatOpenAI(
        base_url=daphne_server.base_url,
        api_key=daphne_server.key,
        model="smollm2",
        temperature=0,
        max_tokens=16,
        max_retries=0,
    )


def test_invoke_answers_with_text_and_usage(chat, daphne_server):
    answer = chat.invoke([HumanMessage("Name a color.")])
    assert isinstance(answer, AIMessage)
    assert answer.content.strip()
    assert answer.response_metadata["model_name"] == "smollm2"
    assert answer.response_metadata["finish_reason"] in ("stop", "length")
    usage = answer.usage_metadata
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"] > 0
    (row,) = daphne_server.written_rows(completion_id=answer.response_metadata["id"])
    assert (row["status_code"], row["completion_tokens"]) == (200, usage["output_tokens"])


def test_stream_gives_the_same_answer_as_invoke(chat):
    question = [HumanMessage("Name a fruit.")]
    pieces = list(chat.stream(question))
    streamed = pieces[0]
    for piece in pieces[1:]:
        streamed += piece
    answer = chat.invoke(question)
    assert streamed.content == answer.content
    assert streamed.response_metadata["finish_reason"] == answer.response_metadata["finish_reason"]


def test_a_stream_asked_for_its_usage_ends_with_it(chat):
    # LangChain asks for the usage chunk of servers other than OpenAI's when told to.
    pieces = list(chat.stream([HumanMessage("Name a fruit.")], stream_usage=True))
    usage = sum(pieces[1:], pieces[0]).usage_metadata
    assert usage["output_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


class City(BaseModel):
    name: str
    country: str


def test_structured_output_is_parsed_by_langchain(daphne_server):
    chat = ChatOpenAI(
        base_url=daphne_server.base_url,
        api_key=daphne_server.key,
        model="smollm2",
        temperature=0,
        max_tokens=200,
        max_retries=0,
    )
    structured = chat.with_structured_output(City, method="json_schema", strict=True)
    city = structured.invoke("Give a city in France as JSON with its name and country.")
    assert isinstance(city, City)
    assert city.name
    assert city.country
