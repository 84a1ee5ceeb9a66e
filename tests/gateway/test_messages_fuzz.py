"""Whatever a client sends to /v1/messages and /v1/messages/count_tokens, the answer is
never a 5xx, it is in Anthropic's envelope, and it is what the OpenAPI document says:
schemathesis's cases from the served document, as tests/gateway/test_fuzz.py sends them
for chat completions."""

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st
from schemathesis import GenerationMode

from tests.support.fuzz import ALIAS, MODES, bounded, checks_for

RANDOM_EXAMPLES = 150  # per generation mode


def assert_messages_answer(response):
    assert response.status_code < 500, response.text
    assert response.headers["request-id"] == response.headers["x-request-id"]
    if response.status_code >= 400:
        body = response.json()
        assert set(body) == {"type", "error", "request_id"}, body
        assert body["type"] == "error"
        assert set(body["error"]) == {"type", "message"}, body
    elif response.headers.get("content-type", [""])[0].startswith("text/event-stream"):
        last = response.text.rstrip("\n").rsplit("\n\n", 1)[-1]
        assert last.startswith("event: message_stop"), last
    else:
        assert set(response.json()) & {"type", "input_tokens"}


def make_servable(body, counting):
    """Repair a schema-valid body so that it breaks no rule across fields either."""
    body.update(model=ALIAS, messages=[{"role": "user", "content": "Hi"}])
    for key in ("tool_choice", "thinking", "mcp_servers"):
        body.pop(key, None)  # a named tool, a budget below max_tokens, no MCP server
    if not counting:
        body["max_tokens"] = 16


def fuzz(operation, mode, client, statuses):
    """RANDOM_EXAMPLES cases in ``mode``: as generated, naming the alias (and the key,
    in the ``x-api-key`` the document offers), or (when valid) repaired to be served."""
    key = client.headers["Authorization"].removeprefix("Bearer ")
    counting = operation.path.endswith("count_tokens")

    @bounded(RANDOM_EXAMPLES)
    @given(
        case=operation.as_strategy(generation_mode=mode),
        shape=st.sampled_from(["as generated", "named", "servable"]),
    )
    def run(case, shape):
        if shape != "as generated" and case.headers is not None:
            case.headers["x-api-key"] = key
        if shape != "as generated" and isinstance(case.body, dict):
            if shape == "servable" and mode is GenerationMode.POSITIVE:
                make_servable(case.body, counting)
            elif isinstance(case.body.get("model"), str):
                case.body["model"] = ALIAS
        response = case.call(session=client)
        assert_messages_answer(response)
        case.validate_response(response, checks=checks_for(response.status_code))
        statuses[response.status_code] += 1

    run()


@pytest.mark.parametrize("path", ["/messages", "/messages/count_tokens"])
def test_messages_never_answer_a_5xx(api, path):
    schema, client = api
    statuses = Counter()
    for mode in MODES:
        fuzz(schema[path]["POST"], mode, client, statuses)
    print(f"\n{sum(statuses.values())} cases for POST {path}:", dict(statuses))
    assert statuses[200]  # not only validation: some were answered
