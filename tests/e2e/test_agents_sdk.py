"""The OpenAI Agents SDK (``openai-agents``), which speaks the Responses API, running an
agent with a function tool against a real daphne serving the embedded model."""

import asyncio

import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

pytestmark = pytest.mark.e2e


@pytest.fixture
def model(daphne_server):
    set_tracing_disabled(True)  # no traces sent to OpenAI: the tests run offline
    client = AsyncOpenAI(base_url=daphne_server.base_url, api_key=daphne_server.key)
    return OpenAIResponsesModel(model="smollm2", openai_client=client)


def weather_agent(model, calls):
    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(city)
        return f"It is sunny in {city}."

    return Agent(
        name="weather",
        instructions="Answer questions about the weather with the get_weather tool.",
        tools=[get_weather],
        model=model,
        # A 135M model does not reliably choose a tool, nor stop calling it: the tool is
        # required, and its result is the answer.
        model_settings=ModelSettings(tool_choice="required", max_tokens=60, temperature=0),
        tool_use_behavior="stop_on_first_tool",
    )


async def run(agent, given, streamed):
    if not streamed:
        return await Runner.run(agent, given, max_turns=2)
    result = Runner.run_streamed(agent, given, max_turns=2)
    async for _ in result.stream_events():
        pass
    return result


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
def test_an_agent_calls_its_tool_and_another_answers_from_the_conversation(
    model, daphne_server, streamed
):
    calls = []
    writer = Agent(
        name="writer",
        instructions="Tell the user the weather in one sentence.",
        model=model,
        model_settings=ModelSettings(max_tokens=40, temperature=0),
    )

    async def both():
        asked = await run(weather_agent(model, calls), "What is the weather in Paris?", streamed)
        # The whole conversation (the question, the call, its output) goes on to a second
        # agent, as the SDK hands a conversation on.
        return asked, await run(writer, asked.to_input_list(), streamed)

    asked, answered = asyncio.run(both())
    assert len(calls) == 1
    assert asked.final_output == f"It is sunny in {calls[0]}."
    assert isinstance(answered.final_output, str)
    assert answered.final_output.strip()
    ids = [
        response.response_id for result in (asked, answered) for response in result.raw_responses
    ]
    assert len(ids) == 2
    rows = [daphne_server.written_rows(completion_id=each)[0] for each in ids]
    assert {(row["endpoint"], row["status_code"], row["stream"]) for row in rows} == {
        ("responses", 200, int(streamed))
    }
