"""Whatever a client sends to /v1/responses, the answer is never a 5xx, and it is what
the OpenAPI document says: schemathesis's cases from the served document, as
tests/test_fuzz.py sends them for chat completions."""

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st
from schemathesis import GenerationMode

from tests.gateway.test_fuzz import ALIAS, CHECKS, MODES, api, bounded  # noqa: F401  (api: a fixture)

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


def test_creating_responses_never_answers_a_5xx(api):  # noqa: F811
    schema, client = api
    statuses = Counter()
    for mode in MODES:
        fuzz_creating(schema["/responses"]["POST"], mode, client, statuses)
    print(f"\n{sum(statuses.values())} cases for POST /responses:", dict(statuses))
    assert statuses[200]  # not only validation: some were answered


@pytest.mark.parametrize(
    "path", ["/responses/{response_id}", "/responses/{response_id}/input_items"]
)
def test_reading_stored_responses_never_answers_a_5xx(api, path):  # noqa: F811
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
