"""The OpenAPI document: valid OpenAPI 3.1, served without a key, and the server's own rules.

The fuzzing (tests/test_fuzz.py) checks the answers against the document; these
tests check that the document says what parse_chat_request enforces.
"""

import re

import jsonschema_rs
import orjson
import pytest
import schemathesis
from django.test import SimpleTestCase, override_settings
from django.urls import include, path

from chatparity.protocol.completion import CompletionAccumulator
from chatparity.protocol.enums import FINISH_REASONS
from chatparity.protocol.errors import APIError
from chatparity.protocol.events import Finish, ReasoningDelta, TextDelta, ToolCallDelta, Usage
from chatparity.protocol.messages import error_body, parse_messages_request
from chatparity.protocol.messages_stream import MessageEncoder
from chatparity.protocol.openapi import openapi_document
from chatparity.protocol.request import Limits, parse_chat_request
from chatparity.protocol.responses import parse_responses_request
from chatparity.protocol.responses_stream import ResponseEncoder
from chatparity.protocol.stream import ChunkEncoder
from chatparity.protocol.upstream import ChunkReader, ServerSentEvent
from tests.support.wire import HI, WEATHER

# A site that mounts the app under /api/ (see test_the_servers_url_follows_the_mount_point).
urlpatterns = [path("api/", include("chatparity.urls"))]

DOCUMENT = openapi_document()
SCHEMAS = DOCUMENT["components"]["schemas"]
REQUEST = SCHEMAS["CreateChatCompletionRequest"]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
# What a parameter needs beside it to be accepted at all.
COMPANIONS = {"top_logprobs": {"logprobs": True}, "stream_options": {"stream": True}}


def request_validator(document=DOCUMENT):
    root = {**document["components"]["schemas"]["CreateChatCompletionRequest"]}
    return jsonschema_rs.Draft202012Validator({**root, "components": document["components"]})


def non_null(schema):
    """The schema of a parameter's value, without the null that means "not given"."""
    if "anyOf" in schema and {"type": "null"} in schema["anyOf"]:
        (schema,) = [each for each in schema["anyOf"] if each != {"type": "null"}]
    if isinstance(schema.get("type"), list):
        (kind,) = [each for each in schema["type"] if each != "null"]
        schema = {**schema, "type": kind}
    return schema


def parse(key, value):
    body = {"model": "m", "messages": HI, key: value, **COMPANIONS.get(key, {})}
    return parse_chat_request(body)


def refusal(key, value):
    with pytest.raises(APIError) as raised:
        parse(key, value)
    return raised.value


def test_the_document_is_valid_openapi_3_1():
    assert DOCUMENT["openapi"] == "3.1.0"
    schemathesis.openapi.from_dict(DOCUMENT).validate()


def documented_invalid(key):
    """A value the document says parameter ``key`` does not take."""
    schema = {**REQUEST["properties"][key], "components": DOCUMENT["components"]}
    validator = jsonschema_rs.Draft202012Validator(schema)
    return next(value for value in ([1], {"x": 1}, "x", 1.5, True) if not validator.is_valid(value))


@pytest.mark.parametrize("key", sorted(REQUEST["properties"]))
def test_every_documented_parameter_is_one_the_server_checks(key):
    refused = refusal(key, documented_invalid(key))
    assert refused.param.startswith(key)
    assert not refused.message.startswith("Unrecognized request argument")


# Parameters of OpenAI's other APIs, or of none.
UNDOCUMENTED = ["best_of", "echo", "suffix", "input", "instructions", "max_output_tokens", "foo"]


@pytest.mark.parametrize("key", UNDOCUMENTED)
def test_a_parameter_the_document_does_not_list_is_refused(key):
    assert key not in REQUEST["properties"]
    refused = refusal(key, 1)
    assert refused.message == f"Unrecognized request argument supplied: {key}"


def test_the_request_is_closed_with_model_and_messages_required():
    assert REQUEST["required"] == ["model", "messages"]
    assert REQUEST["additionalProperties"] is False


def test_the_documented_roles_are_the_servers():
    messages = REQUEST["properties"]["messages"]["items"]
    documented = set(messages["discriminator"]["mapping"])
    refused = refusal("messages", [{"role": "bogus", "content": "Hi"}])
    assert refused.param == "messages[0].role"
    supported = refused.message.split("Supported values are: ")[1]
    assert set(re.findall(r"'([a-z]+)'", supported)) == documented


BOUNDED = [
    (key, non_null(schema))
    for key, schema in REQUEST["properties"].items()
    if {"minimum", "maximum"} & non_null(schema).keys()
]


@pytest.mark.parametrize(("key", "schema"), BOUNDED, ids=[key for key, _ in BOUNDED])
def test_documented_bounds_are_the_servers(key, schema):
    kind = "integer" if schema["type"] == "integer" else "decimal"
    if "minimum" in schema:
        parse(key, schema["minimum"])
        below = refusal(key, schema["minimum"] - 1)
        assert (below.param, below.code) == (key, f"{kind}_below_min_value")
    if "maximum" in schema:
        parse(key, schema["maximum"])
        above = refusal(key, schema["maximum"] + 1)
        assert (above.param, above.code) == (key, f"{kind}_above_max_value")


def test_bounds_are_documented_where_the_server_has_them():
    assert {key for key, _ in BOUNDED} == {
        "frequency_penalty",
        "max_completion_tokens",
        "max_tokens",
        "n",
        "presence_penalty",
        "seed",
        "temperature",
        "top_logprobs",
        "top_p",
    }


ENUMS = [
    (key, non_null(schema)["enum"])
    for key, schema in REQUEST["properties"].items()
    if "enum" in non_null(schema)
]


@pytest.mark.parametrize(("key", "values"), ENUMS, ids=[key for key, _ in ENUMS])
def test_documented_enums_are_the_servers(key, values):
    for value in values:
        parse(key, value)
    refused = refusal(key, "bogus")
    assert (refused.param, refused.code) == (key, "invalid_value")
    assert refused.message.startswith("Invalid value: 'bogus'. Supported values are: ")
    for value in values:
        assert f"'{value}'" in refused.message


def test_the_enums_are_documented():
    assert {key for key, _ in ENUMS} == {
        "prompt_cache_retention", "reasoning_effort", "service_tier", "verbosity",
    }  # fmt: skip


ACCEPTED = {
    "minimal": {"model": "m", "messages": HI},
    "every role, parts and tools": {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Answer in JSON."},
            {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "name": "ada", "content": [{"type": "text", "text": "Weather?"}]},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
            {"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}},
            {"role": "function", "name": "f", "content": "Done"},
        ],
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": False,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "weather", "schema": {"type": "object"}, "strict": True},
        },
        "stream": True,
        "stream_options": {"include_usage": True},
        "logprobs": True,
        "top_logprobs": 20,
        "logit_bias": {"50256": -100, "11": 2.5},
        "metadata": {"run": "1"},
        "store": True,
        "stop": ["\n\n", "END"],
        "n": 2,
        "seed": -7,
    },
    "nulls mean not given": {
        "model": "m",
        "messages": HI,
        **{key: None for key in set(REQUEST["properties"]) - {"model", "messages"}},
    },
}


@pytest.mark.parametrize("body", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_bodies_the_server_accepts_are_valid_by_the_document(body):
    parse_chat_request(body)
    assert request_validator().is_valid(body)


REFUSED = {
    "no messages": {"model": "m"},
    "an unknown key": {"model": "m", "messages": HI, "foo": 1},
    "a message without a role": {"model": "m", "messages": [{"content": "Hi"}]},
    "an image part": {
        "model": "m",
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
    },
    "a tool without a name": {"model": "m", "messages": HI, "tools": [{"type": "function"}]},
    "five stops": {"model": "m", "messages": HI, "stop": ["a", "b", "c", "d", "e"]},
    "a bad function name": {
        "model": "m",
        "messages": HI,
        "tools": [{"type": "function", "function": {"name": "get weather"}}],
    },
    "a logit_bias key that is no token id": {"model": "m", "messages": HI, "logit_bias": {"a": 1}},
    "17 metadata keys": {"model": "m", "messages": HI, "metadata": {str(i): "" for i in range(17)}},
}


@pytest.mark.parametrize("body", REFUSED.values(), ids=REFUSED.keys())
def test_bodies_the_server_refuses_are_invalid_by_the_document(body):
    with pytest.raises(APIError):
        parse_chat_request(body)
    assert not request_validator().is_valid(body)


def test_the_limits_are_stated():
    def body(content, count=1):
        return {"model": "m", "messages": [{"role": "user", "content": content}] * count}

    capped = request_validator(openapi_document(limits=Limits(max_messages=3, max_content_chars=5)))
    assert capped.is_valid(body("12345", count=3))
    assert not capped.is_valid(body("12345", count=4))
    assert not capped.is_valid(body("123456"))
    assert not capped.is_valid(body([{"type": "text", "text": "123456"}]))
    assert request_validator(openapi_document()).is_valid(body("123456", count=4))


def answer_validator(name):
    return jsonschema_rs.Draft202012Validator(
        {**SCHEMAS[name], "components": DOCUMENT["components"]}
    )


@pytest.mark.parametrize("reason", FINISH_REASONS)
def test_every_finish_reason_is_kept_from_upstreams_sent_and_documented(reason):
    reader = ChunkReader(n=1, prompt_tokens=1)
    upstream = {"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": reason}]}
    events = [
        *reader.read(ServerSentEvent("message", orjson.dumps(upstream).decode())),
        Usage(1, 1),
    ]
    assert events[1] == Finish(0, reason)
    encoder = ChunkEncoder(
        completion_id="c", created=0, model="m", system_fingerprint="fp", include_usage=True
    )
    accumulator = CompletionAccumulator()
    for chunk in (chunk for event in events for chunk in encoder.encode(event)):
        assert answer_validator("ChatCompletionChunk").is_valid(chunk), chunk
        accumulator.add(chunk)
    completion = accumulator.completion()
    assert completion["choices"][0]["finish_reason"] == reason
    assert answer_validator("ChatCompletion").is_valid(completion)


def test_a_finish_reason_openai_does_not_send_is_not_documented():
    encoder = ChunkEncoder(completion_id="c", created=0, model="m", system_fingerprint="fp")
    chunks = [*encoder.encode(TextDelta(0, "Hi")), *encoder.encode(Finish(0, "eos"))]
    assert not answer_validator("ChatCompletionChunk").is_valid(chunks[-1])


def test_every_error_status_answers_the_envelope():
    responses = DOCUMENT["paths"]["/chat/completions"]["post"]["responses"]
    errors = {status for status in responses if status != "200"}
    assert errors == {"400", "401", "404", "413", "429", "500", "502", "503", "504"}
    for status in errors:
        assert responses[status]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/Error"
        }


class ServedDocumentTests(SimpleTestCase):
    def test_served_without_a_key_with_the_configured_limits(self):
        limits = {"MAX_BODY_BYTES": 1000, "MAX_MESSAGES": 3, "MAX_CONTENT_CHARS": 5}
        with override_settings(CHATPARITY=limits):
            response = self.client.get("/v1/openapi.json")
        assert response.status_code == 200
        assert response["Content-Type"] == "application/json"
        assert response["x-request-id"].startswith("req_")
        assert response.json() == openapi_document(
            server_url="/v1", limits=Limits(3, 5), max_body_bytes=1000
        )

    def test_the_default_limits_are_served(self):
        document = self.client.get("/v1/openapi.json").json()
        messages = document["components"]["schemas"]["CreateChatCompletionRequest"]["properties"][
            "messages"
        ]
        assert messages["maxItems"] == 2048
        text = document["components"]["schemas"]["TextContentPart"]["properties"]["text"]
        assert text["maxLength"] == 1024 * 1024
        body = document["paths"]["/chat/completions"]["post"]["requestBody"]["description"]
        assert body == f"A JSON object. At most {8 * 1024 * 1024} bytes."

    @override_settings(ROOT_URLCONF=__name__)
    def test_the_servers_url_follows_the_mount_point(self):
        document = self.client.get("/api/v1/openapi.json").json()
        assert document["servers"] == [{"url": "/api/v1"}]


# The Responses API.

RESPONSES_REQUEST = SCHEMAS["CreateResponse"]


def component_validator(name):
    return jsonschema_rs.Draft202012Validator(
        {**SCHEMAS[name], "components": DOCUMENT["components"]}
    )


def parse_response_request(key, value):
    body = {"model": "m", "input": "Hi", key: value}
    return parse_responses_request(body, Limits(), lambda prefix: f"{prefix}_1")


@pytest.mark.parametrize("key", sorted(RESPONSES_REQUEST["properties"]))
def test_every_documented_responses_parameter_is_one_the_server_checks(key):
    schema = {**RESPONSES_REQUEST["properties"][key], "components": DOCUMENT["components"]}
    validator = jsonschema_rs.Draft202012Validator(schema)
    invalid = next(v for v in ([1], {"x": 1}, "x", 1.5, True) if not validator.is_valid(v))
    with pytest.raises(APIError) as refused:
        parse_response_request(key, invalid)
    assert refused.value.param.startswith(key)
    assert refused.value.code != "unknown_parameter"


def test_a_responses_parameter_the_document_does_not_list_is_refused():
    assert RESPONSES_REQUEST["additionalProperties"] is False
    with pytest.raises(APIError) as refused:
        parse_response_request("messages", [])
    assert refused.value.code == "unknown_parameter"


def test_a_response_and_every_event_of_its_stream_are_as_documented():
    encoder = ResponseEncoder(
        response_id="resp_1", created_at=1, model="m", new_id=lambda prefix: f"{prefix}_1",
        settings=parse_response_request("tools", [{"type": "function", "name": "f"}]).settings,
    )  # fmt: skip
    events = encoder.opening()
    for event in (
        TextDelta(0, "Hi"),
        ToolCallDelta(0, 0, "{}", id="call_1", name="f"),
        Finish(0, "tool_calls"),
        Usage(prompt_tokens=3, completion_tokens=2),
    ):
        events += encoder.encode(event)
    events += encoder.closing()
    event_schema = component_validator("ResponseStreamEvent")
    for event in events:
        event_schema.validate(event)
    component_validator("Response").validate(encoder.response())


def test_the_responses_endpoints_are_documented():
    paths = DOCUMENT["paths"]
    assert set(paths["/responses"]) == {"post"}
    assert set(paths["/responses/{response_id}"]) == {"get", "delete"}
    listing = paths["/responses/{response_id}/input_items"]["get"]
    assert [p["name"] for p in listing["parameters"]] == ["response_id", "limit", "order", "after"]


# Anthropic's Messages API.

MESSAGES_REQUEST = SCHEMAS["CreateMessageRequest"]


def parse_message_request(key, value):
    body = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]}
    return parse_messages_request({**body, key: value}, Limits())


@pytest.mark.parametrize("key", sorted(MESSAGES_REQUEST["properties"]))
def test_every_documented_messages_parameter_is_one_the_server_checks(key):
    schema = {**MESSAGES_REQUEST["properties"][key], "components": DOCUMENT["components"]}
    validator = jsonschema_rs.Draft202012Validator(schema)
    invalid = next(v for v in ([1], {"x": 1}, "x", 1.5, True) if not validator.is_valid(v))
    with pytest.raises(APIError) as refused:
        parse_message_request(key, invalid)
    assert refused.value.param.startswith(key)
    assert "Extra inputs" not in refused.value.message


def test_a_messages_parameter_the_document_does_not_list_is_refused():
    assert MESSAGES_REQUEST["additionalProperties"] is False
    assert SCHEMAS["CountMessageTokensRequest"]["additionalProperties"] is False
    with pytest.raises(APIError, match="n: Extra inputs are not permitted"):
        parse_message_request("n", 2)


def test_a_message_and_every_event_of_its_stream_are_as_documented():
    encoder = MessageEncoder(message_id="msg_1", model="m", input_tokens=3, request_id="req_1")
    events = encoder.opening()
    for event in (
        ReasoningDelta(0, "Hm."),
        TextDelta(0, "Hi"),
        ToolCallDelta(0, 0, "{}", id="toolu_1", name="f"),
        Finish(0, "tool_calls"),
        Usage(prompt_tokens=3, completion_tokens=2),
    ):
        events += encoder.encode(event)
    events += encoder.closing()
    event_schema = component_validator("MessageStreamEvent")
    for event in [*events, *encoder.failing(APIError("late", status=502))]:
        event_schema.validate(event)
    component_validator("Message").validate(encoder.message())
    component_validator("AnthropicError").validate(error_body(APIError("bad"), "req_1"))


def test_the_messages_endpoints_answer_anthropics_errors_and_take_its_key():
    for endpoint in ("/messages", "/messages/count_tokens"):
        operation = DOCUMENT["paths"][endpoint]["post"]
        assert operation["security"] == [{"apiKey": []}, {"bearerAuth": []}]
        for status, answer in operation["responses"].items():
            assert "request-id" in answer["headers"]
            if status != "200":
                assert answer["content"]["application/json"]["schema"] == {
                    "$ref": "#/components/schemas/AnthropicError"
                }
    assert DOCUMENT["components"]["securitySchemes"]["apiKey"]["name"] == "x-api-key"
