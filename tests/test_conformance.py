"""The conformance checks, judged without a network.

A canonical fake server (chatparity's own request parser, ChunkEncoder and
CompletionAccumulator behind ``httpx.MockTransport``) passes every check; each
defect below is applied to its canonical response and must flip exactly the
check it breaks to FAIL, with a reason that names the defect.
"""

import copy
import itertools
import json
from collections.abc import Callable
from io import StringIO
from typing import Any

import httpx
import pytest
from django.core.management import CommandError, call_command

from chatparity.conformance import framework, suite
from chatparity.conformance.chat import MODELS, parse_stream
from chatparity.conformance.framework import Check, Runner, select
from chatparity.conformance.messages import parse_message_stream
from chatparity.conformance.responses import parse_event_stream
from chatparity.conformance.suite import CHECKS
from chatparity.protocol import errors
from chatparity.protocol.completion import CompletionAccumulator
from chatparity.protocol.embeddings import (
    Embeddings,
    embeddings_object,
    packed,
    parse_embeddings_request,
)
from chatparity.protocol.errors import APIError
from chatparity.protocol.events import Event, Finish, TextDelta, ToolCallDelta, Usage
from chatparity.protocol.messages import as_chat_request as messages_chat_request
from chatparity.protocol.messages import error_body, error_status, parse_messages_request
from chatparity.protocol.messages_stream import MessageEncoder
from chatparity.protocol.messages_stream import sse_event as message_event
from chatparity.protocol.request import NO_LIMITS, ChatRequest, parse_chat_request
from chatparity.protocol.responses import (
    as_chat_request,
    parse_responses_request,
    response_not_found,
)
from chatparity.protocol.responses_stream import ResponseEncoder, sse_event
from chatparity.protocol.stream import DONE, ChunkEncoder, sse
from chatparity.protocol.tokens import approximate_prompt_tokens
from chatparity.transport.cors import CorsPolicy, is_preflight
from tests.scripted import scripted_vector

MODEL = "smollm2"
EMBEDDING_MODEL = "embed-small"
KEY = "sk-test"
BASE_URL = "http://testserver/v1"
WORDS = ["Once", " upon", " a", " time", ",", " a", " dragon", " slept", "."]
BY_NAME = {check.name: check for check in CHECKS}
CLIENT = framework.client


def events(chat: ChatRequest) -> list[Event]:
    """What a well-behaved backend says: the words (cut at max_tokens) or a weather call."""
    script: list[Event] = []
    tokens = 0
    for index in range(chat.n):
        if chat.response_format is not None and chat.response_format.type == "json_schema":
            script.append(TextDelta(index, '{"qty": 9}'))  # the most the schema allows
            reason = "stop"
            tokens += 5
        elif chat.tools and chat.tool_choice.mode in ("required", "function"):
            call = ToolCallDelta(index, 0, "", id=f"call_{index}", name="get_weather")
            fragments = ['{"city": ', '"Paris"}']
            script += [call, *(ToolCallDelta(index, 0, part) for part in fragments)]
            reason = "stop" if chat.tool_choice.mode == "function" else "tool_calls"
            tokens += 1 + len(fragments)
        else:
            words = WORDS[: chat.max_tokens]
            script += [TextDelta(index, word) for word in words]
            reason = "length" if len(words) < len(WORDS) else "stop"
            tokens += len(words)
        script.append(Finish(index, reason))
    return [*script, Usage(prompt_tokens=9, completion_tokens=tokens)]


def json_response(payload: Any, status: int = 200) -> httpx.Response:
    return httpx.Response(status, json=payload)


def stream_response(chunks: list[dict[str, Any]]) -> httpx.Response:
    body = b"".join(sse(chunk) for chunk in chunks) + DONE
    return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})


def canonical_server(request: httpx.Request) -> httpx.Response:
    """A fake OpenAI: right envelopes, right errors, right chunk order, and any page may
    call it (chatparity's own CORS answers)."""
    origin = request.headers.get("origin")
    if origin is None:
        return answer(request)
    if is_preflight(request.method, request.headers):
        return httpx.Response(200, headers=ANY_ORIGIN.preflight_headers(request.headers))
    response = answer(request)
    headers = dict(response.headers)
    ANY_ORIGIN.add_response_headers(origin, headers)
    return httpx.Response(response.status_code, headers=headers, content=response.content)


ANY_ORIGIN = CorsPolicy(["*"])


def answer(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/v1/models":
        models = [
            {"id": name, "object": "model", "created": 1700000000, "owned_by": "me"}
            for name in (EMBEDDING_MODEL, MODEL)  # the chat model is not the first listed
        ]
        return json_response({"object": "list", "data": models})
    if request.url.path == "/v1/embeddings":
        return embeddings_server(request)
    if request.url.path.startswith("/v1/responses"):
        return responses_server(request)
    if request.url.path.startswith("/v1/messages"):
        return messages_server(request)
    try:
        if request.headers.get("authorization") != f"Bearer {KEY}":
            raise errors.invalid_api_key(request.headers.get("authorization", ""))
        asked = json.loads(request.content)
        model = asked.get("model")
        # As OpenAI: a model it does not serve is told before anything else is checked.
        if isinstance(model, str) and model and model != MODEL:
            raise errors.model_not_found(model)
        chat = parse_chat_request(asked)
    except APIError as error:
        return json_response(error.envelope(), error.status)
    encoder = ChunkEncoder(
        completion_id="chatcmpl-test",
        created=1700000000,
        model=chat.model,
        system_fingerprint="fp_test",
        include_usage=chat.include_usage or not chat.stream,
        legacy_functions=chat.legacy_functions,
    )
    chunks = [chunk for event in events(chat) for chunk in encoder.encode(event)]
    if chat.stream:
        return stream_response(chunks)
    accumulator = CompletionAccumulator()
    for chunk in chunks:
        accumulator.add(chunk)
    return json_response(accumulator.completion())


def embeddings_server(request: httpx.Request) -> httpx.Response:
    """A fake embeddings API: chatparity's own request parser and answer, each input's
    vector made of its text (token ids: of their digits)."""
    try:
        asked = parse_embeddings_request(json.loads(request.content), NO_LIMITS)
        if asked.model != EMBEDDING_MODEL:
            raise errors.model_not_found(asked.model)
    except APIError as error:
        return json_response(error.envelope(), error.status)
    texts = [text if isinstance(text, str) else repr(text) for text in asked.inputs]
    vectors = [packed(scripted_vector(text, 8)) for text in texts]
    answer = Embeddings(vectors, prompt_tokens=sum(len(text.split()) for text in texts))
    return json_response(
        embeddings_object(answer, model=asked.model, encoding_format=asked.encoding_format)
    )


STORED: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
"""The canonical Responses server's stored responses and their input, by id."""


NUMBERS = itertools.count()


def new_id(prefix: str) -> str:
    return f"{prefix}_{next(NUMBERS):012x}"


def response_events(chat: ChatRequest) -> list[Event]:
    """A well-behaved backend answering a Responses request: a longer story than
    :func:`events` tells (``max_output_tokens`` is at least 16), or the same weather call."""
    if chat.tools:
        return events(chat)
    words = (WORDS * 3)[: chat.max_tokens]
    reason = "length" if len(words) < len(WORDS) * 3 else "stop"
    usage = Usage(prompt_tokens=9, completion_tokens=len(words))
    return [*(TextDelta(0, word) for word in words), Finish(0, reason), usage]


def responses_server(request: httpx.Request) -> httpx.Response:
    """A fake OpenAI Responses API: chatparity's own request parser and ResponseEncoder,
    responses kept in :data:`STORED`."""
    try:
        if request.headers.get("authorization") != f"Bearer {KEY}":
            raise errors.invalid_api_key(request.headers.get("authorization", ""))
        response_id, _, listing = request.url.path.removeprefix("/v1/responses/").partition("/")
        if request.method != "POST":
            if response_id not in STORED:
                raise response_not_found(response_id)
            if request.method == "DELETE":
                del STORED[response_id]
                return json_response({"id": response_id, "object": "response", "deleted": True})
            stored, items = STORED[response_id]
            if not listing:
                return json_response(stored)
            data = items[::-1]  # OpenAI's default order: newest first
            ends = {"first_id": data[0]["id"], "last_id": data[-1]["id"]}
            return json_response({"object": "list", "data": data, **ends, "has_more": False})
        asked = parse_responses_request(json.loads(request.content), NO_LIMITS, new_id)
        if asked.model != MODEL:
            raise errors.model_not_found(asked.model)
        chat = as_chat_request(asked, [], NO_LIMITS)
    except APIError as error:
        return json_response(error.envelope(), error.status)
    encoder = ResponseEncoder(
        response_id=new_id("resp"),
        created_at=1700000000,
        model=asked.model,
        settings=asked.settings,
        new_id=new_id,
    )
    said = [*encoder.opening()]
    said += [each for event in response_events(chat) for each in encoder.encode(event)]
    said += encoder.closing()
    if asked.store:
        STORED[encoder.response()["id"]] = (encoder.response(), asked.input)
    if asked.stream:
        return event_stream_response(said)
    return json_response(encoder.response())


def messages_server(request: httpx.Request) -> httpx.Response:
    """A fake Anthropic Messages API: chatparity's own request parser and MessageEncoder."""
    counting = request.url.path.endswith("/count_tokens")
    try:
        if request.headers.get("x-api-key") != KEY:
            raise errors.invalid_api_key(request.headers.get("x-api-key", ""))
        asked = parse_messages_request(json.loads(request.content), NO_LIMITS, counting=counting)
        if asked.model != MODEL:
            raise errors.model_not_found(asked.model)
        chat = messages_chat_request(asked, NO_LIMITS)
    except APIError as error:
        failed = json_response(error_body(error, "req_test"), error_status(error))
        failed.headers["request-id"] = "req_test"
        return failed
    if counting:
        return json_response({"input_tokens": approximate_prompt_tokens(chat.messages)})
    encoder = MessageEncoder(
        message_id=new_id("msg"), model=asked.model, input_tokens=9, request_id="req_test"
    )
    said = [*encoder.opening()]
    said += [each for event in events(chat) for each in encoder.encode(event)]
    said += encoder.closing()
    if asked.stream:
        body = b"".join(message_event(event) for event in said)
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})
    return json_response(encoder.message())


def event_stream_response(events: list[dict[str, Any]]) -> httpx.Response:
    body = b"".join(sse_event(event) for event in events)
    return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})


def http(handler: Callable[[httpx.Request], httpx.Response] = canonical_server) -> httpx.Client:
    return CLIENT(BASE_URL, KEY, transport=httpx.MockTransport(handler))


@pytest.fixture(scope="module")
def canonical() -> dict[str, list[httpx.Response]]:
    """Each check's canonical responses, by check name."""
    runner = Runner(http(), MODEL, EMBEDDING_MODEL)
    return {check.name: [runner.send(probe) for probe in check.probes] for check in CHECKS}


def model_of(check: Check) -> str:
    """The model ``check`` asks for (its API's kind of model)."""
    return check.probes[0].model_of(Runner(http(), MODEL, EMBEDDING_MODEL))


def test_the_canonical_server_passes_every_check_sending_each_probe_once():
    sent = []

    def counting(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return canonical_server(request)

    runner = Runner(http(counting), MODEL, EMBEDDING_MODEL)
    results = runner.run_all(CHECKS)
    assert [(r.name, r.problems) for r in results if not r.ok] == []
    assert [r.name for r in results] == [check.name for check in CHECKS]
    probes = {probe.cache_key(probe.model_of(runner)) for check in CHECKS for probe in check.probes}
    assert len(sent) == len(probes)


def test_without_an_embedding_model_the_embeddings_checks_are_not_run():
    results = Runner(http(), MODEL).run_all(CHECKS)
    assert [r.name for r in results] == [c.name for c in CHECKS if c.name[:11] != "embeddings."]


# Defects: (check, a mutation of its last response, words the reason must contain).

Mutation = Callable[[httpx.Response], httpx.Response]
DROP = object()


def edit(target: Any, path: str, fields: dict[str, Any]) -> None:
    """Set ``fields`` on the object at dotted ``path`` in ``target``; DROP removes one."""
    for part in filter(None, path.split(".")):
        target = target[int(part)] if isinstance(target, list) else target[part]
    for key, value in fields.items():
        if value is DROP:
            del target[key]
        else:
            target[key] = value


def on_chunks(change: Callable[[list[dict[str, Any]]], Any]) -> Mutation:
    def mutate(response: httpx.Response) -> httpx.Response:
        chunks = copy.deepcopy(parse_stream(response.content).chunks)
        change(chunks)
        return stream_response(chunks)

    return mutate


def chunk(number: int, path: str = "", **fields: Any) -> Mutation:
    return on_chunks(lambda chunks: edit(chunks[number], path, fields))


def every_chunk(path: str = "", **fields: Any) -> Mutation:
    return on_chunks(lambda chunks: [edit(each, path, fields) for each in chunks])


def body(path: str = "", *, status: int | None = None, **fields: Any) -> Mutation:
    def mutate(response: httpx.Response) -> httpx.Response:
        payload = response.json()
        edit(payload, path, fields)
        return json_response(payload, status or response.status_code)

    return mutate


def on_bytes(change: Callable[[bytes], bytes], content_type: str = "text/event-stream") -> Mutation:
    def mutate(response: httpx.Response) -> httpx.Response:
        headers = {"content-type": content_type}
        return httpx.Response(200, content=change(response.content), headers=headers)

    return mutate


def replace_with(response: httpx.Response) -> Mutation:
    return lambda _: response


def choice(chunk: dict[str, Any]) -> dict[str, Any]:
    return chunk["choices"][0]


def content_after_finisher(chunks):
    chunks[-1], chunks[-2] = chunks[-2], chunks[-1]


def no_usage_chunk(chunks):
    del chunks[-1]


def only_choice_zero(chunks):
    chunks[:] = [c for c in chunks if choice(c)["index"] == 0]


def only_the_finisher(chunks):
    chunks[:] = chunks[-1:]


def drop_choice_one_finisher(chunks):
    chunks[:] = [c for c in chunks if not (choice(c)["index"] == 1 and choice(c)["finish_reason"])]


def repeat_call_id(chunks):
    """What llama.cpp does: every delta of a call repeats its id, type and name."""
    first = choice(chunks[0])["delta"]["tool_calls"][0]
    for each in chunks[1:-1]:
        call = choice(each)["delta"]["tool_calls"][0]
        call |= {"id": first["id"], "type": "function"}
        call["function"]["name"] = "get_weather"


def break_arguments(chunks):
    choice(chunks[-2])["delta"]["tool_calls"][0]["function"]["arguments"] = '"Par'


def headers(status: int | None = None, **changes: str | None) -> Mutation:
    """Set the response's headers (``_`` for ``-`` in their names; None removes one)."""

    def mutate(response: httpx.Response) -> httpx.Response:
        edited = {name.lower(): value for name, value in response.headers.items()}
        for name, value in changes.items():
            edited[name.replace("_", "-")] = value
        kept = {name: value for name, value in edited.items() if value is not None}
        return httpx.Response(
            status or response.status_code, headers=kept, content=response.content
        )

    return mutate


MESSAGE = "choices.0.message"
BARE_ROLE_CHUNK = chunk(0, "choices.0", delta={"role": "assistant"})
STREAMED_ERROR = stream_response([{"error": {"message": "no", "type": "x", "param": None}}])

DEFECTS = [
    ("models.list", body("data.0", created=DROP), "mistypes created"),
    ("nonstream.envelope", body(model="Smollm2"), "expected the requested"),
    ("nonstream.envelope", body(system_fingerprint=DROP), "no system_fingerprint key"),
    ("nonstream.envelope", body(created="1"), 'created is "1"'),
    ("nonstream.envelope", body(object="text_completion"), "object is"),
    ("nonstream.message", body(MESSAGE, refusal=DROP), "lacks refusal"),
    ("nonstream.message", body(MESSAGE, annotations=DROP), "lacks annotations"),
    ("nonstream.message", body(MESSAGE, role="bot"), 'role is "bot"'),
    ("nonstream.message", body("choices.0", logprobs=DROP), "lacks logprobs"),
    ("nonstream.usage", body("usage", total_tokens=1), "not prompt_tokens"),
    ("nonstream.usage", body("usage", prompt_tokens_details=DROP), "details is null"),
    ("nonstream.usage", body(usage=DROP), "usage is null"),
    ("stream.framing", on_bytes(lambda b: b.removesuffix(DONE)), "no data: [DONE]"),
    ("stream.framing", on_bytes(lambda b: b + b"data: {}\n\n"), "events after data: [DONE]"),
    ("stream.framing", on_bytes(lambda b: b.replace(b"\n", b"\r\n")), "CR line endings"),
    ("stream.framing", on_bytes(lambda b: b"event: x\n" + b), "not one 'data: ' line"),
    ("stream.framing", on_bytes(lambda b: b, "application/json"), "Content-Type"),
    ("stream.framing", replace_with(STREAMED_ERROR), "error frame"),
    ("stream.envelope", chunk(2, id="chatcmpl-x"), "id changes"),
    ("stream.envelope", chunk(2, created=1), "created changes"),
    ("stream.envelope", every_chunk(model="m"), "(11 chunks, first #0)"),
    ("stream.envelope", chunk(1, service_tier=DROP), "no service_tier key"),
    ("stream.envelope", every_chunk(system_fingerprint=DROP), "no system_fingerprint key"),
    ("stream.envelope", chunk(3, object="x"), 'object is "x"'),
    ("stream.choices", on_chunks(lambda c: c.pop(0)), "does not open with a role chunk"),
    ("stream.choices", BARE_ROLE_CHUNK, 'got {"role":"assistant"}'),
    ("stream.choices", chunk(1, "choices.0", finish_reason="stop"), 'with delta {"content"'),
    ("stream.choices", on_chunks(content_after_finisher), "has a chunk after its finisher"),
    ("stream.choices", on_chunks(lambda c: c.pop()), "choice 0 has no finisher"),
    ("stream.choices", chunk(2, "choices.0", logprobs=DROP), "choice keys are"),
    ("stream.choices", chunk(2, "choices.0.delta", role=None), "expected just one of"),
    ("stream.choices", chunk(2, "choices.0.delta", role="assistant"), "role repeated"),
    ("stream.choices", chunk(-1, "choices.0", finish_reason="x"), "unknown reason"),
    ("stream.choices", on_chunks(lambda c: c.append({**c[0], "choices": []})), "no choices"),
    ("stream.no-usage", every_chunk(usage=None), "usage key present"),
    ("usage.stream", on_chunks(no_usage_chunk), "include_usage ignored"),
    ("usage.stream", chunk(1, usage=DROP), "no usage key"),
    ("usage.stream", chunk(1, usage={}), "usage is {} before"),
    ("usage.stream", chunk(-1, "usage", total_tokens=0), "not prompt_tokens"),
    ("usage.stream", chunk(-1, "usage", completion_tokens_details=DROP), "details is null"),
    ("parity.stream-vs-nonstream", chunk(1, "choices.0.delta", content="X"), "content differs"),
    ("parity.stream-vs-nonstream", chunk(-1, "usage", completion_tokens=7), "9 vs streamed 7"),
    ("parity.stream-vs-nonstream", on_chunks(no_usage_chunk), "no usage chunk"),
    ("length.nonstream", body("choices.0", finish_reason="stop"), "expected 'length'"),
    ("length.nonstream", body("usage", completion_tokens=4), "expected 5"),
    ("length.stream", chunk(-1, "usage", completion_tokens=6), "is 6, expected 5"),
    ("length.stream", on_chunks(no_usage_chunk), "no usage to count"),
    ("n.nonstream", body(choices=[]), "expected [0, 1]"),
    ("n.stream", on_chunks(only_choice_zero), "expected [0, 1]"),
    ("n.stream", on_chunks(drop_choice_one_finisher), "choice 1 has no finisher"),
    ("tools.required.stream", on_chunks(repeat_call_id), "carry more than index"),
    ("tools.required.stream", on_chunks(break_arguments), "not a JSON object"),
    ("tools.required.stream", BARE_ROLE_CHUNK, "first delta of call 0 has keys"),
    ("tools.required.stream", on_chunks(only_the_finisher), "no tool call was streamed"),
    ("tools.required.stream", chunk(-1, "choices.0", finish_reason="stop"), "'tool_calls'"),
    ("tools.named.stream", chunk(-1, "choices.0", finish_reason="tool_calls"), "'stop'"),
    ("tools.named.stream", chunk(0, "choices.0.delta", content=""), "role chunk"),
    ("tools.required.nonstream", body(MESSAGE, content=""), "expected null"),
    ("tools.required.nonstream", body(MESSAGE, tool_calls=DROP), "tool_calls is null"),
    ("errors.missing-messages", body(detail="x"), 'expected {"error"'),
    ("errors.missing-messages", body("error", code=DROP), "error keys are"),
    ("errors.missing-messages", body("error", param=None), "param is null"),
    ("errors.bad-key", body("error", code=None), "code is null"),
    ("errors.bad-key", body(status=403), "HTTP 403"),
    ("errors.unknown-model", body("error", type="not_found"), "type is"),
    ("errors.stream-status", replace_with(stream_response([])), "HTTP 200 (text/event-stream)"),
    ("errors.unknown-argument", body("error", message="Bad"), "message is"),
    ("errors.temperature", body(status=422), "HTTP 422"),
    ("schema.numeric-bounds", body(MESSAGE, content='{"qty": 25}'), "qty is 25, outside"),
    ("schema.numeric-bounds", body(MESSAGE, content="25 apples"), "with an integer qty"),
    ("functions.named.nonstream", body(MESSAGE, function_call=DROP), "lacks function_call"),
    ("functions.named.nonstream", body(MESSAGE, tool_calls=[{}]), "expected none"),
    ("functions.named.nonstream", body(MESSAGE, content=""), "expected null"),
    ("functions.named.nonstream", body(f"{MESSAGE}.function_call", arguments='"Par'),
     "not a JSON object"),
    ("functions.named.nonstream", body("choices.0", finish_reason="function_call"),
     "expected 'stop'"),
    ("functions.named.stream", chunk(0, "choices.0.delta.function_call", arguments="{"),
     "role chunk is"),
    ("functions.named.stream", chunk(1, "choices.0.delta", tool_calls=[]),
     "expected just function_call"),
    ("functions.named.stream", chunk(1, "choices.0.delta.function_call", name="get_weather"),
     "expected just arguments"),
    ("functions.named.stream", chunk(-2, "choices.0.delta.function_call", arguments='"Par'),
     "not a JSON object"),
    ("functions.named.stream", chunk(-1, "choices.0", finish_reason="function_call"),
     "expected 'stop'"),
    ("functions.auto.nonstream", body("choices.0", finish_reason="function_call"),
     "a text answer finishes with"),
    ("functions.auto.nonstream",
     body(MESSAGE, content=None, function_call={"name": "get_weather", "arguments": "{}"}),
     "expected 'function_call'"),
    ("functions.none.nonstream",
     body(MESSAGE, function_call={"name": "get_weather", "arguments": "{}"}), "expected none"),
    ("cors.preflight", headers(access_control_allow_origin=None), "Allow-Origin is null"),
    ("cors.preflight", headers(access_control_allow_origin="https://other.example"),
     'is "https://other.example"'),
    ("cors.preflight", headers(access_control_allow_headers="content-type"),
     "lacks authorization"),
    ("cors.preflight", headers(access_control_allow_headers="*"), "lacks authorization"),
    ("cors.preflight", headers(access_control_allow_methods="GET"), "lacks POST"),
    ("cors.preflight", headers(405), "HTTP 405"),
    ("cors.response", headers(access_control_allow_origin=None), "Allow-Origin is null"),
    ("stop.empty-list", replace_with(json_response({"error": {}}, 400)), "HTTP 400"),
    ("errors.metadata-without-store", body("error", param=None), "param is null"),
    ("errors.metadata-long-key", body(status=200), "HTTP 200"),
    ("errors.logit-bias-range", body("error", param="logit_bias.12345"), "param is"),
    ("errors.logit-bias-range", body("error", code="decimal_above_max_value"), "code is"),
    ("errors.modalities", body("error", code=None), "code is null"),
    ("errors.audio-format", body("error", param="audio"), 'param is "audio"'),
    ("errors.max-tokens-combination", body("error", code="invalid_value"), "code is"),
    ("errors.empty-model-first", body("error", message="Missing 'messages'."), "message is"),
    ("errors.unknown-model-first", body(status=400), "HTTP 400"),
    ("errors.check-order", body("error", param="stream_options"), "param is"),
    ("errors.refusal-part", body("error", code=None), "code is null"),
]  # fmt: skip


# Defects of the Responses API's checks.


def on_events(change: Callable[[list[dict[str, Any]]], Any]) -> Mutation:
    def mutate(response: httpx.Response) -> httpx.Response:
        events = copy.deepcopy(parse_event_stream(response.content).events)
        change(events)
        return event_stream_response(events)

    return mutate


def event(number: int, path: str = "", **fields: Any) -> Mutation:
    return on_events(lambda events: edit(events[number], path, fields))


def of_type(kind: str, path: str = "", **fields: Any) -> Mutation:
    """Edit every event of type ``kind``."""
    return on_events(lambda events: [edit(e, path, fields) for e in events if e["type"] == kind])


def drop(kind: str) -> Mutation:
    return on_events(lambda events: [events.remove(e) for e in list(events) if e["type"] == kind])


def renumbered(change: Callable[[list[dict[str, Any]]], Any]) -> Mutation:
    """``change`` the events, then number them again, so only ``change`` is wrong."""

    def numbered(events):
        change(events)
        for number, each in enumerate(events):
            each["sequence_number"] = number

    return on_events(numbered)


def json_status(value: str, path: str = "") -> Mutation:
    """Set a ``status`` field of the body (``body``'s own ``status`` is the HTTP one)."""

    def mutate(response: httpx.Response) -> httpx.Response:
        payload = response.json()
        edit(payload, path, {"status": value})
        return json_response(payload, response.status_code)

    return mutate


def swap_item_done_and_part_done(events):
    kinds = [e["type"] for e in events]
    part, item = kinds.index("response.content_part.done"), kinds.index("response.output_item.done")
    events[part], events[item] = events[item], events[part]


FINAL = "-1.response"
TEXT_DELTA = "response.output_text.delta"

RESPONSES_DEFECTS = [
    ("responses.object", body(id="chatcmpl-1"), "expected 'resp_...'"),
    ("responses.object", body(object="chat.completion"), "expected 'response'"),
    ("responses.object", body(model="SMOLLM2"), "expected the requested"),
    ("responses.object", body(tools=DROP, text=DROP), "no text, tools key(s)"),
    ("responses.object", body("output.0.content.0", annotations=DROP), "annotations null"),
    ("responses.object", body("output.0", role="user"), "role is \"user\""),
    ("responses.object", body(output=[]), "output is empty"),
    ("responses.usage", body("usage", total_tokens=1), "is not input_tokens"),
    ("responses.usage", body("usage", input_tokens_details=DROP), "cached_tokens"),
    ("responses.usage", body(usage=None), "usage is null"),
    ("responses.stream.framing", on_bytes(lambda b: b + b"data: [DONE]\n\n"), "[DONE] sent"),
    ("responses.stream.framing", on_bytes(lambda b: b.replace(b"event: ", b"")), "'event:' line"),
    ("responses.stream.framing",
     on_bytes(lambda b: b.replace(b"event: response.in_progress", b"event: progress")),
     "event: progress carries type"),
    ("responses.stream.framing", on_bytes(lambda b: b, "application/json"), "Content-Type"),
    ("responses.stream.framing", on_bytes(lambda b: b.replace(b"\n", b"\r\n")), "CR line"),
    ("responses.stream.sequence", event(3, sequence_number=2), "is 2 at event #3, expected 3"),
    ("responses.stream.sequence", on_events(lambda e: e.pop(4)), "is 5 at event #4, expected 4"),
    ("responses.stream.sequence", event(0, sequence_number=1), "is 1 at event #0, expected 0"),
    ("responses.stream.order", renumbered(lambda e: e.pop(1)), "the stream opens with"),
    ("responses.stream.order", renumbered(lambda e: e.pop()), "the last event is"),
    ("responses.stream.order", renumbered(swap_item_done_and_part_done), "output item 0's events"),
    ("responses.stream.order", of_type(TEXT_DELTA, item_id="msg_other"), "another item_id"),
    ("responses.stream.order", event(5, delta="X"), "deltas add up to"),
    ("responses.stream.order", event(-1, type="response.incomplete"), "not response.completed"),
    ("responses.stream.order",
     on_events(lambda e: [each.update(output_index=1) for each in e if "output_index" in each]),
     "output_index values are [1]"),
    ("responses.stream.usage", event(-1, "response", usage=None), "usage is null"),
    ("responses.stream.usage", event(-1, "response.usage", output_tokens=0), "is not input"),
    ("responses.parity", event(-1, "response", output_text="x"), "not shaped like"),
    ("responses.parity", event(-1, "response.output.0.content.0", text="X"), "text differs"),
    ("responses.parity", event(-1, "response.usage", output_tokens=3), "usage 27 vs streamed 3"),
    ("responses.parity", renumbered(lambda e: e.pop()), "no final response"),
    ("responses.incomplete", json_status("completed"), "expected 'incomplete'"),
    ("responses.incomplete", body(incomplete_details=None), "incomplete_details is null"),
    ("responses.incomplete", body("usage", output_tokens=17), "is 17, expected 16"),
    ("responses.incomplete.stream", renumbered(lambda e: e.pop()), "the last event is"),
    ("responses.incomplete.stream", event(-1, "response", incomplete_details=None),
     "incomplete_details is null"),
    ("responses.function-call", body("output.0", call_id=None), "call_id is null"),
    ("responses.function-call", body("output.0", arguments='"Par'), "not a JSON object"),
    ("responses.function-call", body("output.0", type="message"), "no function_call item"),
    ("responses.function-call", json_status("in_progress", "output.0"), "expected 'completed'"),
    ("responses.function-call.stream", drop("response.function_call_arguments.done"),
     "output item 0's events"),
    ("responses.function-call.stream", event(-3, arguments="{}"), "deltas add up to"),
    ("responses.function-call.stream", of_type("response.output_item.done", "item", name="x"),
     "name is \"x\""),
    ("responses.store.lifecycle", body(status=200), "after delete: HTTP 200"),
    ("responses.store.lifecycle", body("error", type="not_found"), "after delete: error.type"),
    ("responses.store.input-items", body(has_more=None), "has_more is null"),
    ("responses.store.input-items", body(first_id="x"), "first_id, last_id are"),
    ("responses.store.input-items", body(data=[]), "expected the input message"),
    ("responses.store.input-items", body("data.0", role="assistant"), "the input message is"),
    ("responses.error.temperature", body("error", param="top_p"), "param is"),
    ("responses.error.unknown-parameter", body("error", code=None), "code is null"),
    ("responses.error.stream-status",
     replace_with(event_stream_response([{"type": "error"}])), "HTTP 200"),
    ("responses.error.key", body(status=403), "HTTP 403"),
]  # fmt: skip
DEFECTS += RESPONSES_DEFECTS


# Defects of the Messages API's checks.


def on_messages(change: Callable[[list[dict[str, Any]]], Any]) -> Mutation:
    def mutate(response: httpx.Response) -> httpx.Response:
        events = copy.deepcopy(parse_message_stream(response.content).events)
        change(events)
        content = b"".join(message_event(event) for event in events)
        return httpx.Response(200, content=content, headers={"content-type": "text/event-stream"})

    return mutate


def message(number: int, path: str = "", **fields: Any) -> Mutation:
    return on_messages(lambda events: edit(events[number], path, fields))


def error_headers(response: httpx.Response) -> httpx.Response:
    return httpx.Response(response.status_code, json=response.json())  # no request-id


MESSAGES_DEFECTS = [
    ("messages.object", body(id="chatcmpl-1"), "expected 'msg_...'"),
    ("messages.object", body(model="SMOLLM2"), "expected 'smollm2'"),
    ("messages.object", body(stop_reason="stop"), "stop_reason is \"stop\""),
    ("messages.object", body(stop_sequence=DROP), "no stop_sequence key"),
    ("messages.object", body("content.0", type="output_text"), "expected text, tool_use"),
    ("messages.object", body("usage", output_tokens=None), "usage.output_tokens is null"),
    ("messages.stream.framing", on_bytes(lambda b: b + b"data: [DONE]\n\n"), "[DONE] sent"),
    ("messages.stream.framing", on_bytes(lambda b: b.replace(b"event: ", b"")), "'event:' line"),
    ("messages.stream.framing", on_bytes(lambda b: b, "application/json"), "Content-Type"),
    ("messages.stream.framing",
     on_bytes(lambda b: b.replace(b"event: message_stop", b"event: stop")), "carries type"),
    ("messages.stream.order", on_messages(lambda e: e.pop(0)), "expected message_start"),
    ("messages.stream.order", message(0, "message", stop_reason="end_turn"),
     "message_start's stop_reason"),
    ("messages.stream.order", message(0, "message", content=[{"type": "text", "text": "x"}]),
     "message_start's content"),
    ("messages.stream.order", on_messages(lambda e: e.pop(-3)), "never stops"),
    ("messages.stream.order", message(2, index=1), "which is not open"),
    ("messages.stream.order", message(2, "delta", type="input_json_delta"),
     "in a text block"),
    ("messages.stream.order", on_messages(lambda e: e.pop()), "the stream ends with"),
    ("messages.stream.order", message(-2, "delta", stop_reason=None), "message_delta's delta"),
    ("messages.parity", message(2, "delta", text="X"), "text differs"),
    ("messages.parity", message(-2, "usage", output_tokens=3), "output_tokens 9 vs streamed 3"),
    ("messages.parity", message(-2, "delta", stop_reason="max_tokens"), "stop_reason"),
    ("messages.max-tokens", body(stop_reason="end_turn"), "expected 'max_tokens'"),
    ("messages.max-tokens", body("usage", output_tokens=4), "expected 5"),
    ("messages.max-tokens.stream", message(-2, "usage", output_tokens=6), "is 6, expected 5"),
    ("messages.tool-use", body("content.0", input="{}"), "not an object"),
    ("messages.tool-use", body(content=[]), "no tool_use block"),
    ("messages.tool-use", body(stop_reason="end_turn"), "expected 'tool_use'"),
    ("messages.tool-use.stream", message(1, "content_block", input={"city": "x"}),
     "starts with input"),
    ("messages.tool-use.stream", message(2, "delta", type="text_delta"), "in a tool_use block"),
    ("messages.count-tokens", body(input_tokens="9"), "expected {\"input_tokens\""),
    ("messages.error.max-tokens", body("error", type="invalid_request"), "error.type is"),
    ("messages.error.max-tokens", error_headers, "no request-id header"),
    ("messages.error.unknown-parameter", body(error={"message": "x", "type": "x", "code": None}),
     "error keys are"),
    ("messages.error.stream-status", replace_with(stream_response([])), "HTTP 200"),
    ("messages.error.key", body(status=403), "HTTP 403"),
    ("messages.error.model", body(type="failure"), 'expected {"type": "error"'),
]  # fmt: skip
DEFECTS += MESSAGES_DEFECTS

EMBEDDINGS_DEFECTS = [
    ("embeddings.object", body("data.1", index=0), "index 0"),
    ("embeddings.object", body(model="other"), 'model is "other"'),
    ("embeddings.object", body("usage", total_tokens=0), "total_tokens must be"),
    ("embeddings.object", body("data.2", embedding=["0.5"]), "expected numbers"),
    ("embeddings.base64", body("data.0", embedding="AAAAAA=="), "not the float vector's float32"),
    ("embeddings.base64", body("data.0", embedding="!!"), "expected base64"),
    ("embeddings.batch", body("data.0", embedding=scripted_vector("other", 8)), "cosine"),
    ("embeddings.token-ids", body(data=[]), "expected 2 embeddings"),
    ("embeddings.errors.empty-input", replace_with(json_response({"data": []})), "HTTP 200"),
    ("embeddings.errors.unknown-argument", body("error", type="x"), "error.type is"),
]  # fmt: skip
DEFECTS += EMBEDDINGS_DEFECTS


@pytest.mark.parametrize(("name", "mutate", "reason"), DEFECTS)
def test_a_defect_fails_its_check_with_a_useful_reason(canonical, name, mutate, reason):
    check = BY_NAME[name]
    responses = list(canonical[name])
    assert check.judge(model_of(check), responses) == []
    responses[-1] = mutate(responses[-1])
    problems = check.judge(model_of(check), responses)
    assert problems, f"{name} passed a defective response"
    assert any(reason in problem for problem in problems), problems


def test_every_check_has_a_defect_that_fails_it():
    assert {name for name, *_ in DEFECTS} == set(BY_NAME)


def test_a_problem_in_many_chunks_is_reported_once_with_where_it_occurs(canonical):
    response = every_chunk(usage=None)(canonical["stream.no-usage"][0])
    (problem,) = BY_NAME["stream.no-usage"].judge(MODEL, [response])
    assert problem.endswith("(11 chunks, first #0)")


def test_keepalive_comments_are_allowed():
    body = b": keepalive\n\n" + canonical_stream_bytes() + b": bye\n\n"
    stream = parse_stream(body)
    assert stream.problems == []
    assert stream.done


def canonical_stream_bytes() -> bytes:
    encoder = ChunkEncoder(completion_id="c", created=1, model=MODEL, system_fingerprint="fp")
    chunks = [c for e in [TextDelta(0, "Hi"), Finish(0, "stop")] for c in encoder.encode(e)]
    return b"".join(sse(chunk) for chunk in chunks) + DONE


# Running: independence, failures, selection, the command.


def test_a_failed_request_fails_only_the_checks_that_need_it():
    def no_streams(request: httpx.Request) -> httpx.Response:
        if request.content and json.loads(request.content).get("stream"):
            raise httpx.ReadTimeout("timed out", request=request)
        return canonical_server(request)

    results = {r.name: r for r in Runner(http(no_streams), MODEL, EMBEDDING_MODEL).run_all(CHECKS)}
    failed = {name for name, result in results.items() if not result.ok}
    assert failed == {c.name for c in CHECKS if any(p.body.get("stream") for p in c.probes)}
    assert {"parity.stream-vs-nonstream", "errors.stream-status"} < failed
    assert results["stream.framing"].reason() == "request failed: ReadTimeout: timed out"


def test_a_judge_that_crashes_fails_its_own_row_only():
    def broken(model, responses):
        raise KeyError("x")

    check = Check("broken", "", (MODELS,), broken)
    runner = Runner(http(), MODEL)
    assert runner.run(check).reason() == "could not judge the response: KeyError('x')"
    assert runner.run(BY_NAME["models.list"]).ok


@pytest.mark.parametrize(
    ("only", "skip", "expected"),
    [
        (["errors.bad"], [], ["errors.bad-key"]),
        (["tools."], [".stream"], ["tools.required.nonstream"]),
        (["length", "n."], ["nonstream"], ["length.stream", "n.stream"]),
    ],
)
def test_only_and_skip_match_substrings(only, skip, expected):
    assert [check.name for check in select(CHECKS, only=only, skip=skip)] == expected


@pytest.fixture
def served_by(monkeypatch):
    """Make the command talk to ``handler`` instead of the network."""

    def serve(handler, timeout=60.0):
        def fake_client(base_url, key, seconds, **options):
            assert (base_url, key, seconds) == (BASE_URL, KEY, timeout)
            return http(handler)

        monkeypatch.setattr(suite, "client", fake_client)

    return serve


def test_command_prints_the_table_and_succeeds_on_a_conformant_server(served_by):
    served_by(canonical_server)
    out = StringIO()
    call_command("chatparity_conformance", BASE_URL, "--key", KEY, stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == f"{BASE_URL}  model 'smollm2'"
    assert lines[1].split() == ["CHECK", "RESULT", "REASON"]
    assert lines[2].split() == ["models.list", "PASS"]
    assert lines[-1] == f"{len(CHECKS)} checks: {len(CHECKS)} passed, 0 failed"


def test_command_fails_with_status_1_and_json_results_on_a_defect(served_by):
    def no_refusal(request: httpx.Request) -> httpx.Response:
        response = canonical_server(request)
        if request.method != "POST" or json.loads(request.content).get("stream"):
            return response
        body = response.json()
        if "choices" not in body:
            return response  # another API's answer, its headers kept
        for item in body["choices"]:
            item["message"].pop("refusal")
        return json_response(body, response.status_code)

    served_by(no_refusal, timeout=5)
    out = StringIO()
    with pytest.raises(CommandError) as raised:
        call_command(
            "chatparity_conformance", BASE_URL, "--key", KEY, "--json", "--skip", "errors",
            "--skip", "functions", "--skip", "cors", "--timeout", "5", stdout=out,
        )  # fmt: skip
    assert raised.value.returncode == 1
    report = json.loads(out.getvalue())
    failed = {check["name"]: check["reason"] for check in report["checks"] if not check["ok"]}
    assert failed.keys() == {"nonstream.message", "tools.required.nonstream"}
    assert failed["nonstream.message"] == "choices[0].message lacks refusal, expected null"
    assert report["model"] == MODEL
    assert report["passed"] is False


def test_command_without_a_model_to_test_exits_2(served_by):
    served_by(lambda request: json_response({"error": {}}, 500))
    with pytest.raises(CommandError, match="pass --model") as raised:
        call_command("chatparity_conformance", BASE_URL, "--key", KEY, stdout=StringIO())
    assert raised.value.returncode == 2


def test_command_lists_the_selected_checks_without_a_server():
    out = StringIO()
    call_command("chatparity_conformance", "--list", "--only", "tools.", stdout=out)
    assert [line.split()[0] for line in out.getvalue().splitlines()] == [
        "tools.required.stream", "tools.named.stream", "tools.required.nonstream",
    ]  # fmt: skip
