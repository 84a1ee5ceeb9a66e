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


# Cache markers anywhere Anthropic takes one and where it does not, of any shape.

MARKERS = st.one_of(
    st.none(),
    st.builds(
        lambda ttl: {"type": "ephemeral"} if ttl is None else {"type": "ephemeral", "ttl": ttl},
        st.sampled_from([None, "5m", "1h", "2h", "", 5]),
    ),
    st.sampled_from([{"type": "persistent"}, {}, {"ttl": "1h"}, "ephemeral", [], None]),
)
TEXTS = st.sampled_from(["Hi", "", " ", "Rules of the house."])


def _marked(block, marker):
    return block if marker is None else {**block, "cache_control": marker}


def _text(words, marker):
    return _marked({"type": "text", "text": words}, marker)


MARKED_BODIES = st.fixed_dictionaries(
    {
        "system": st.lists(st.builds(_text, TEXTS, MARKERS), max_size=3),
        "tools": st.lists(
            st.builds(
                lambda i, marker: _marked(
                    {"name": f"tool_{i}", "input_schema": {"type": "object"}}, marker
                ),
                st.integers(0, 1000),
                MARKERS,
            ),
            max_size=3,
            unique_by=lambda tool: tool["name"],
        ),
        "first": st.lists(st.builds(_text, TEXTS, MARKERS), min_size=1, max_size=3),
        "thinking": st.builds(
            lambda marker: _marked(
                {"type": "thinking", "thinking": "Hm.", "signature": "s"}, marker
            ),
            MARKERS,
        ),
        "last": st.lists(st.builds(_text, TEXTS, MARKERS), min_size=1, max_size=3),
        "cache_control": MARKERS,
    }
)


def _markers(body):
    """The markers of an answered body, in Anthropic's order."""
    blocks = [*body["tools"], *body["system"]]
    blocks += [block for turn in body["messages"] for block in turn["content"]]
    return [block["cache_control"] for block in blocks if block.get("cache_control") is not None]


def test_cache_markers_of_any_shape_never_answer_a_5xx(api):
    """Markers where Anthropic takes them and where it does not (thinking, empty text),
    too many, of an unknown ttl or type: a 400 in Anthropic's envelope, never a 5xx; what
    is answered holds at most four, none of an hour after one of five minutes."""
    _, client = api
    statuses = Counter()

    @bounded(RANDOM_EXAMPLES)
    @given(drawn=MARKED_BODIES, stream=st.booleans())
    def run(drawn, stream):
        body = {
            "model": ALIAS,
            "max_tokens": 16,
            "stream": stream,
            "system": drawn["system"],
            "tools": drawn["tools"],
            "messages": [
                {"role": "user", "content": drawn["first"]},
                {
                    "role": "assistant",
                    "content": [drawn["thinking"], {"type": "text", "text": "Ok"}],
                },
                {"role": "user", "content": drawn["last"]},
            ],
        }
        if drawn["cache_control"] is not None:
            body["cache_control"] = drawn["cache_control"]
        response = client.post("/v1/messages", json=body)
        assert_messages_answer(response)
        statuses[response.status_code] += 1
        if response.status_code == 200:
            ttls = [marker.get("ttl", "5m") for marker in _markers(body)]
            assert len(ttls) <= 4
            if "5m" in ttls:
                assert "1h" not in ttls[ttls.index("5m") :]

    run()
    print("\ncache markers:", dict(statuses))
    assert statuses[200]
    assert statuses[400]
