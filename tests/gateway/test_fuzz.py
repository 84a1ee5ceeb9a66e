"""Whatever a client sends, the answer is never a 5xx.

Schemathesis generates requests from the served OpenAPI document, valid ones and
ones that break it, and sends them with a valid key to the project's ASGI
application in-process: first its coverage cases (every boundary, every wrong
type, every missing field, at every depth; deterministic), then a fixed number
of random ones from a fixed seed. The alias they name is served by the scripted
test backend, so a case costs milliseconds rather than a model's generation.
Hand-written requests below cover what a schema cannot describe.
"""

import time
from collections import Counter

import orjson
import pytest
from django.test import TestCase, override_settings
from hypothesis import given
from hypothesis import strategies as st
from schemathesis import GenerationMode

from chatparity.models import ApiKey, Backend, ModelAlias, RequestLog
from chatparity.protocol.errors import invalid_json
from tests.scripted import SCRIPTED
from tests.support.fuzz import ALIAS, CHECKS, MODES, bounded

RANDOM_EXAMPLES = 150  # per generation mode, for chat completions
MODELS_EXAMPLES = 25  # per generation mode and models endpoint
MIN_CHAT_CASES = 1000


def assert_openai_answer(response):
    """What every answer to a generated request must be."""
    status = response.status_code
    assert status < 500, response.text
    content_type = response.headers.get("content-type", [""])[0]
    if status >= 400:
        body = response.json()
        assert set(body) == {"error"}, body
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
        assert isinstance(body["error"]["message"], str)
        assert isinstance(body["error"]["type"], str)
    elif content_type.startswith("text/event-stream"):
        assert response.text.endswith("data: [DONE]\n\n"), response.text
    elif response.request.method == "POST":
        assert response.json()["object"] == "chat.completion"
    else:
        assert response.json()["object"] in {"list", "model"}


def name_the_alias(case):
    """Name the scripted alias: a generated model id is a 404 once the body is
    valid, which would hide whether the rest of it was."""
    if isinstance(case.body, dict) and isinstance(case.body.get("model"), str):
        case.body["model"] = ALIAS


def send_chat(case, client, outcomes, phase):
    logged = RequestLog.objects.count()
    response = case.call(session=client)
    assert_openai_answer(response)
    case.validate_response(response, checks=CHECKS)
    # Every authenticated request leaves one log row, whatever its outcome. Negative
    # cases may break the Authorization header (401) and coverage tries other methods
    # (405): those are refused before authentication, and not logged.
    refused_before_authentication = response.status_code in {401, 405}
    assert RequestLog.objects.count() == logged + (not refused_before_authentication)
    outcome = str(response.status_code)
    if response.status_code == 200:
        streamed = response.headers["content-type"][0].startswith("text/event-stream")
        outcome += " stream" if streamed else " completion"
    outcomes[phase, outcome] += 1


def make_servable(body, stream):
    """Repair a schema-valid body so that it breaks no rule across fields either."""
    body["model"] = ALIAS
    body["stream"] = stream
    for key in ("n", "max_tokens", "max_completion_tokens", "top_logprobs", "seed"):
        if isinstance(body.get(key), float):
            body[key] = int(body[key])  # JSON Schema counts 2.0 as an integer; OpenAI does not
    if not stream:
        body.pop("stream_options", None)
    if not body.get("logprobs"):
        body.pop("top_logprobs", None)
    if not body.get("tools"):
        body.pop("tool_choice", None)
        body.pop("parallel_tool_calls", None)
    elif isinstance(body.get("tool_choice"), dict):
        body["tool_choice"] = "auto"
    if (body.get("response_format") or {}).get("type") == "json_object":
        body.pop("response_format")  # it needs the word json in a message
    # Tool results must answer the calls just made, and an assistant needs content or calls.
    instructions = {"system", "developer", "user"}
    messages = [message for message in body["messages"] if message["role"] in instructions]
    body["messages"] = messages or [{"role": "user", "content": "Hi"}]


def fuzz_chat(operation, mode, client, outcomes):
    """RANDOM_EXAMPLES random cases in ``mode``: as generated, naming the alias, or
    (when valid) repaired to be served, streamed or not."""

    @bounded(RANDOM_EXAMPLES)
    @given(
        case=operation.as_strategy(generation_mode=mode),
        shape=st.sampled_from(["as generated", "named", "servable"]),
        stream=st.booleans(),
    )
    def fuzz(case, shape, stream):
        if shape != "as generated":
            name_the_alias(case)
        if shape == "servable" and mode is GenerationMode.POSITIVE:
            make_servable(case.body, stream)
        send_chat(case, client, outcomes, mode.value)

    fuzz()


def test_chat_completions_never_answer_a_5xx(api):
    schema, client = api
    operation = schema["/chat/completions"]["POST"]
    outcomes = Counter()
    started = time.perf_counter()

    coverage = schema.iter_coverage_cases(
        operation, generation_modes=list(MODES), generation_config=schema.config.generation
    )
    for case in coverage:
        name_the_alias(case)
        send_chat(case, client, outcomes, "coverage")
    for mode in MODES:
        fuzz_chat(operation, mode, client, outcomes)

    cases = sum(outcomes.values())
    print(
        f"\n{cases} chat completion cases in {time.perf_counter() - started:.1f}s:",
        dict(sorted(outcomes.items())),
    )
    assert cases >= MIN_CHAT_CASES
    # Not only validation: the backend answered, in both formats, to random cases too.
    assert {"200 completion", "200 stream"} <= {outcome for _, outcome in outcomes}
    assert any(phase != "coverage" and outcome.startswith("200") for phase, outcome in outcomes)


@pytest.mark.parametrize(
    ("path", "modes"),
    [
        ("/models", MODES),
        # Breaking {model}'s one rule (minLength 1) asks for GET /v1/models/, which is
        # no operation of the API.
        ("/models/{model}", [GenerationMode.POSITIVE]),
    ],
)
def test_models_never_answer_a_5xx(api, path, modes):
    schema, client = api
    operation = schema[path]["GET"]
    statuses = Counter()
    for mode in modes:

        @bounded(MODELS_EXAMPLES)
        @given(case=operation.as_strategy(generation_mode=mode), named=st.booleans())
        def fuzz(case, named):
            if named and case.path_parameters:
                case.path_parameters["model"] = ALIAS.upper()  # ids match case-insensitively
            response = case.call(session=client)
            assert_openai_answer(response)
            case.validate_response(response, checks=CHECKS)
            statuses[response.status_code] += 1

        fuzz()
    print(f"\n{sum(statuses.values())} cases for GET {path}:", dict(statuses))
    assert sum(statuses.values()) >= MODELS_EXAMPLES


# Hand-written: what a schema cannot describe, at the default limits.

INVALID_JSON = invalid_json().envelope()
HI = [{"role": "user", "content": "Hi"}]


@override_settings(CHATPARITY={**SCRIPTED, "LOG_BODIES": True})
class MalformedRequestTests(TestCase):
    @classmethod
    def setUpTestData(cls):
        cls.key, cls.plaintext = ApiKey.objects.create_key("tests")
        backend = Backend.objects.create(
            name="scripted", kind="scripted", options={"script": ["a"]}
        )
        ModelAlias.objects.create(public_id=ALIAS, backend=backend)

    def post(self, data, content_type="application/json", **headers):
        if not isinstance(data, bytes):
            data = orjson.dumps(data)
        return self.async_client.post(
            "/v1/chat/completions",
            data=data,
            content_type=content_type,
            headers={"Authorization": f"Bearer {self.plaintext}", **headers},
        )

    async def assert_error(self, response, status, error):
        assert response.status_code == status
        assert response.json() == {"error": error}
        row = await RequestLog.objects.alatest("pk")
        assert (row.status_code, row.error_type) == (status, error["type"])

    async def assert_invalid_json(self, data, **kwargs):
        await self.assert_error(await self.post(data, **kwargs), 400, INVALID_JSON["error"])

    async def test_bodies_that_are_not_json_are_openais_invalid_json(self):
        for data in [
            b"",
            b"{",
            b'{"model": "scripted",}',
            b"{'model': 'scripted'}",
            b"model=scripted",
            b"\xef\xbb\xbf{}",  # a byte order mark
        ]:
            with self.subTest(data=data):
                await self.assert_invalid_json(data)

    async def test_invalid_utf8_is_invalid_json(self):
        for data in [b'{"model": "\xff\xfe"}', b"\xc3\x28", b'{"model": "\xed\xa0\x80"}']:
            with self.subTest(data=data):
                await self.assert_invalid_json(data)

    async def test_nan_infinity_and_lone_surrogates_are_invalid_json(self):
        for literal in [b"NaN", b"Infinity", b"-Infinity", b'"\\ud800"']:
            with self.subTest(literal=literal):
                await self.assert_invalid_json(
                    b'{"model": "scripted", "messages": [], "temperature": ' + literal + b"}"
                )

    async def test_deep_nesting_is_invalid_json_not_a_recursion_error(self):
        for depth in [129, 1_000, 10_000]:
            nested = b"[" * depth + b"]" * depth
            with self.subTest(depth=depth):
                await self.assert_invalid_json(nested)
                await self.assert_invalid_json(
                    b'{"model": "scripted", "messages": [{"role": "user", "content": "Hi"}],'
                    b' "web_search_options": {"a": ' + nested + b"}}"
                )

    async def test_nesting_within_the_limit_is_served_and_logged(self):
        nested = b"[" * 120 + b"]" * 120
        response = await self.post(
            b'{"model": "scripted", "messages": [{"role": "user", "content": "Hi"}],'
            b' "web_search_options": {"a": ' + nested + b"}}"
        )
        assert response.status_code == 200
        row = await RequestLog.objects.aget()
        assert row.request_body["web_search_options"]["a"] == orjson.loads(nested)

    async def test_a_body_that_is_not_an_object_is_invalid_json(self):
        for data in [b"[]", b'[{"model": "scripted"}]', b'"scripted"', b"42", b"true", b"null"]:
            with self.subTest(data=data):
                await self.assert_invalid_json(data)

    async def test_duplicate_keys_keep_the_last_value(self):
        response = await self.post(
            b'{"model": "nope", "model": "scripted", "messages": [{"role": "user", "content":'
            b' "Hi"}], "n": "x", "n": 1}'
        )
        assert response.status_code == 200
        assert response.json()["model"] == "scripted"

    async def test_the_content_type_is_not_consulted(self):
        body = {"model": ALIAS, "messages": HI}
        for content_type in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data",
        ]:
            with self.subTest(content_type=content_type):
                response = await self.post(body, content_type=content_type)
                assert response.status_code == 200
        await self.assert_invalid_json(b"model=scripted", content_type="text/plain")

    async def test_unknown_top_level_fields_are_named(self):
        response = await self.post({"model": ALIAS, "messages": HI, "temperture": 1})
        await self.assert_error(
            response,
            400,
            {
                "message": "Unrecognized request argument supplied: temperture",
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            },
        )

    async def test_wrong_types_at_every_depth_name_their_path(self):
        for changes, param in [
            ({"model": ["scripted"]}, "model"),
            ({"messages": {"role": "user"}}, "messages"),
            ({"messages": [["user", "Hi"]]}, "messages[0]"),
            ({"messages": [{"role": 1, "content": "Hi"}]}, "messages[0].role"),
            ({"messages": [{"role": "user", "content": {"text": "Hi"}}]}, "messages[0].content"),
            (
                {"messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]},
                "messages[0].content[0].text",
            ),
            ({"tools": [{"type": "function", "function": []}]}, "tools[0].function"),
            (
                {"tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]},
                "tools[0].function.strict",
            ),
            (
                {"stream": True, "stream_options": {"include_usage": 1}},
                "stream_options.include_usage",
            ),
            ({"logit_bias": {"11": [1]}}, "logit_bias.11"),
        ]:
            with self.subTest(param=param):
                response = await self.post({"model": ALIAS, "messages": HI, **changes})
                assert response.status_code == 400
                error = response.json()["error"]
                assert (error["param"], error["code"]) == (param, "invalid_type"), error

    async def test_a_body_over_the_limit_is_413_and_logged(self):
        limit = 8 * 1024 * 1024
        content = "x" * (limit - 60)  # a body just over 8 MiB once in its envelope
        data = orjson.dumps({"model": ALIAS, "messages": [{"role": "user", "content": content}]})
        assert len(data) > limit
        await self.assert_error(
            await self.post(data),
            413,
            {
                "message": "Request too large: the request body exceeds the maximum size of"
                f" {limit} bytes.",
                "type": "invalid_request_error",
                "param": None,
                "code": "request_too_large",
            },
        )

    async def test_the_declared_length_is_refused_before_the_body_is_read(self):
        response = await self.post(b"", CONTENT_LENGTH=str(8 * 1024 * 1024 + 1))
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "request_too_large"

    async def test_a_malformed_content_length_is_ignored(self):
        for declared in ["abc", "-1", "1e9", "²"]:
            with self.subTest(declared=declared):
                await self.assert_invalid_json(b"", CONTENT_LENGTH=declared)

    async def test_a_body_above_djangos_upload_limit_but_within_ours_is_served(self):
        # DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB) does not apply: MAX_BODY_BYTES does.
        messages = [{"role": "user", "content": "x" * 1_000_000} for _ in range(3)]
        response = await self.post({"model": ALIAS, "messages": messages})
        assert response.status_code == 200
        assert response.json()["object"] == "chat.completion"

    async def test_too_many_messages_is_openais_array_too_long(self):
        messages = HI * 3000
        await self.assert_error(
            await self.post({"model": ALIAS, "messages": messages}),
            400,
            {
                "message": "Invalid 'messages': array too long. Expected an array with maximum"
                " length 2048, but got an array with length 3000 instead.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "array_above_max_length",
            },
        )

    async def test_a_huge_content_is_openais_string_too_long(self):
        messages = [*HI, {"role": "user", "content": "x" * 2_000_000}]
        await self.assert_error(
            await self.post({"model": ALIAS, "messages": messages}),
            400,
            {
                "message": "Invalid 'messages[1].content': string too long. Expected a string"
                " with maximum length 1048576, but got a string with length 2000000 instead.",
                "type": "invalid_request_error",
                "param": "messages[1].content",
                "code": "string_above_max_length",
            },
        )

    async def test_an_unauthenticated_oversized_body_is_401_and_not_logged(self):
        response = await self.async_client.post(
            "/v1/chat/completions",
            data=b"x" * (8 * 1024 * 1024 + 1),
            content_type="application/json",
        )
        assert response.status_code == 401
        assert await RequestLog.objects.acount() == 0
