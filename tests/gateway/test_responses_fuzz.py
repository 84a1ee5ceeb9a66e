"""Whatever a client sends to /v1/responses, the answer is never a 5xx, and it is what
the OpenAPI document says: schemathesis's cases from the served document, as
tests/test_fuzz.py sends them for chat completions."""

from collections import Counter

import orjson
import pytest
from django.test import override_settings
from hypothesis import given
from hypothesis import strategies as st
from schemathesis import GenerationMode

from chatparity.models import Backend, ModelAlias
from chatparity.protocol.responses import HOSTED_TOOL_TYPES
from tests.support.fuzz import ALIAS, CHECKS, FUZZ_SETTINGS, MODES, bounded

RANDOM_EXAMPLES = 150  # per generation mode


def assert_responses_answer(response):
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        body = response.json()
        assert set(body) == {"error"}, body
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
    elif response.headers.get("content-type", [""])[0].startswith("text/event-stream"):
        last = response.text.rstrip("\n").rsplit("\n\n", 1)[-1]
        assert last.startswith(("event: response.completed", "event: response.incomplete"))
    else:
        assert response.json()["object"] in {"response", "list"}


def make_servable(body):
    """Repair a schema-valid body so that it breaks no rule across fields either."""
    body.update(model=ALIAS, input="Hi")
    for key in ("previous_response_id", "background", "tool_choice", "text"):
        body.pop(key, None)  # a stored id, a rule of OpenAI's, a named tool, "json" in input
    for key in ("max_output_tokens", "max_tool_calls"):
        if isinstance(body.get(key), float):
            body[key] = int(body[key])  # JSON Schema counts 2.0 as an integer; OpenAI does not


def fuzz_creating(operation, mode, client, statuses):
    """RANDOM_EXAMPLES cases in ``mode``: as generated, naming the alias, or (when
    valid) repaired to be served."""

    @bounded(RANDOM_EXAMPLES)
    @given(
        case=operation.as_strategy(generation_mode=mode),
        shape=st.sampled_from(["as generated", "named", "servable"]),
    )
    def fuzz(case, shape):
        if shape != "as generated" and isinstance(case.body, dict):
            if shape == "servable" and mode is GenerationMode.POSITIVE:
                make_servable(case.body)
            elif isinstance(case.body.get("model"), str):
                case.body["model"] = ALIAS
        response = case.call(session=client)
        assert_responses_answer(response)
        case.validate_response(response, checks=CHECKS)
        statuses[response.status_code] += 1

    fuzz()


def test_creating_responses_never_answers_a_5xx(api):
    schema, client = api
    statuses = Counter()
    for mode in MODES:
        fuzz_creating(schema["/responses"]["POST"], mode, client, statuses)
    print(f"\n{sum(statuses.values())} cases for POST /responses:", dict(statuses))
    assert statuses[200]  # not only validation: some were answered


@pytest.mark.parametrize(
    "path", ["/responses/{response_id}", "/responses/{response_id}/input_items"]
)
def test_reading_stored_responses_never_answers_a_5xx(api, path):
    schema, client = api
    statuses = Counter()
    for method in schema[path]:
        operation = schema[path][method]

        @bounded(25)
        @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE))
        def fuzz(case):
            response = case.call(session=client)
            assert_responses_answer(response)
            case.validate_response(response, checks=CHECKS)
            statuses[response.status_code] += 1

        fuzz()
    assert set(statuses) <= {200, 400, 404}


# The tool shapes Codex sends: namespaces, hosted tools, calls of a namespace's function.

CALLER = "calls-every-tool"
# Names that meet once flattened (a__b, and b in namespace a), at the length limit, or any.
NAMES = st.sampled_from(["a", "b", "a__b", "close", "x" * 62, "x" * 64]) | st.from_regex(
    r"[a-zA-Z0-9_-]{1,64}", fullmatch=True
)


def function(name):
    return {"type": "function", "name": name, "parameters": {"type": "object"}, "strict": False}


NAMESPACES = st.builds(
    lambda name, names, description: {
        "type": "namespace",
        "name": name,
        "description": description,
        "tools": [function(each) for each in names],
    },
    NAMES,
    st.lists(NAMES, min_size=1, max_size=3),
    st.text(max_size=8),
)
HOSTED = st.sampled_from(HOSTED_TOOL_TYPES).map(lambda kind: {"type": kind})
TOOLS = st.lists(st.one_of(NAMES.map(function), NAMESPACES, HOSTED), max_size=6)


def offered(tools):
    """The (namespace, name) of each function ``tools`` offer a backend, in order."""
    return [
        pair
        for tool in tools
        for pair in (
            [(None, tool["name"])]
            if tool["type"] == "function"
            else [(tool["name"], each["name"]) for each in tool.get("tools", ())]
        )
    ]


def answered(response, stream):
    """The response object of a 200, streamed or not."""
    if not stream:
        return response.json()
    last = response.text.rstrip("\n").rsplit("\n\n", 1)[-1]
    return orjson.loads(last.split("\ndata: ", 1)[1])["response"]


@pytest.fixture
def caller(api):
    """``api``'s client, and an alias whose backend calls every function it is offered."""
    backend = Backend.objects.create(
        name=CALLER, kind="scripted", options={"script": ["<call every tool>"]}
    )
    ModelAlias.objects.create(public_id=CALLER, backend=backend)
    return api[1]


def test_every_call_of_any_tools_comes_back_as_the_function_it_names(caller):
    """Whatever functions, namespaces and hosted tools are sent: never a 5xx; a hosted
    tool is refused or left out as the policy says; each call the backend makes of a
    flat name is the function it was offered for, and continues as one."""
    statuses = Counter()

    @bounded(RANDOM_EXAMPLES)
    @given(tools=TOOLS, stream=st.booleans(), policy=st.sampled_from(["omit", "refuse"]))
    def fuzz(tools, stream, policy):
        with override_settings(CHATPARITY={**FUZZ_SETTINGS, "HOSTED_TOOLS": {"*": policy}}):
            body = {"model": CALLER, "input": "Hi", "tools": tools, "stream": stream}
            response = caller.post("/v1/responses", json=body)
            assert response.status_code < 500, response.text
            statuses[response.status_code] += 1
            hosted = any(tool["type"] in HOSTED_TOOL_TYPES for tool in tools)
            if hosted and policy == "refuse":
                assert response.status_code == 400
                assert response.json()["error"]["code"] == "unsupported_value"
                return
            if response.status_code != 200:
                assert set(response.json()["error"]) == {"message", "type", "param", "code"}
                return
            answer = answered(response, stream)
            calls = [item for item in answer["output"] if item["type"] == "function_call"]
            assert [(call.get("namespace"), call["name"]) for call in calls] == offered(tools)
            outputs = [
                {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}
                for call in calls
            ]
            # Continued from the stored response, or with the whole history sent again (as
            # Codex does, with store false): the calls are the functions offered again.
            stored = {**body, "input": outputs or "Go on.", "previous_response_id": answer["id"]}
            history = {**body, "input": [{"role": "user", "content": "Hi"}, *calls, *outputs]}
            for continued in (stored, history):
                again = caller.post("/v1/responses", json={**continued, "stream": False})
                if again.status_code != 200:  # more calls than the test's MAX_MESSAGES allows
                    assert again.json()["error"]["code"] == "array_above_max_length", again.text

    fuzz()
    print("\nnew tool shapes:", dict(statuses))
    assert statuses[200]
    assert statuses[400]
