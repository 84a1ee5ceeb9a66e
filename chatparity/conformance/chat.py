"""The Chat Completions API's checks: does a server speak OpenAI's wire format?

``POST /chat/completions`` (stream and not, tools, the deprecated functions, errors,
CORS) and ``GET /models``, judged against the canonical contract (see ``DESIGN.md``):
rows of :data:`CHECKS`, built on :mod:`.framework`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httpx

from ..protocol.enums import FINISH_REASONS
from .framework import (
    GET_WEATHER,
    HELLO_PROMPT,
    INVALID,
    OMIT,
    STORY_PROMPT,
    UNKNOWN_ARGUMENT,
    WEATHER_PROMPT,
    Check,
    Judge,
    Probe,
    Problems,
    field_is,
    is_int,
    json_body,
    judge_all,
    judge_error,
    judge_json,
    judge_parsed,
    keys_of,
    listed,
    short,
    status_code_problems,
)

CHOICE_KEYS = frozenset({"index", "delta", "logprobs", "finish_reason"})
TEXT_ROLE_DELTA: dict[str, Any] = {"role": "assistant", "content": "", "refusal": None}
USAGE_DETAILS: dict[str, tuple[str, ...]] = {
    "prompt_tokens_details": ("cached_tokens", "audio_tokens"),
    "completion_tokens_details": (
        "reasoning_tokens",
        "audio_tokens",
        "accepted_prediction_tokens",
        "rejected_prediction_tokens",
    ),
}

HELLO = [{"role": "user", "content": HELLO_PROMPT}]
STORY = [{"role": "user", "content": STORY_PROMPT}]
WEATHER = [{"role": "user", "content": WEATHER_PROMPT}]
WEATHER_TOOL: dict[str, Any] = {"type": "function", "function": GET_WEATHER}
LENGTH_TOKENS = 5
UNKNOWN_MODEL = "chatparity-conformance-no-such-model"


# Requests.


@dataclass(frozen=True)
class ChatProbe(Probe):
    """A chat completion request: a short, greedy question unless ``body`` says otherwise."""

    path: str = "/chat/completions"
    defaults: ClassVar[Mapping[str, Any]] = {
        "messages": HELLO,
        "temperature": 0,
        "max_tokens": 16,
    }


MODELS = Probe(method="GET", path="/models")
COMPLETION = ChatProbe()
STREAM = ChatProbe({"stream": True})
STREAM_USAGE = ChatProbe({"stream": True, "stream_options": {"include_usage": True}})
LENGTH = ChatProbe({"messages": STORY, "max_tokens": LENGTH_TOKENS})
LENGTH_STREAM = ChatProbe({**LENGTH.body, **STREAM_USAGE.body})
N2 = ChatProbe({"n": 2})
N2_STREAM = ChatProbe({"n": 2, "stream": True})
NAMED_TOOL = {"type": "function", "function": {"name": "get_weather"}}


def _tools(tool_choice: Any, *, stream: bool) -> Probe:
    body = {"messages": WEATHER, "tools": [WEATHER_TOOL], "tool_choice": tool_choice}
    return ChatProbe({**body, "max_tokens": 64, "stream": stream})


def _functions(function_call: Any, *, stream: bool = False) -> Probe:
    """The deprecated ``functions`` and ``function_call`` in place of tools."""
    body = {"messages": WEATHER, "functions": [GET_WEATHER]}
    return ChatProbe({**body, "function_call": function_call, "max_tokens": 64, "stream": stream})


ORDER = [{"role": "user", "content": "Order 25 apples. Answer with the order as JSON."}]
BOUNDED_ORDER = ChatProbe(
    {
        "messages": ORDER,
        "max_tokens": 40,
        "response_format": {
            "type": "json_schema",
            "json_schema": {
                "name": "order",
                "strict": True,
                "schema": {
                    "type": "object",
                    "properties": {"qty": {"type": "integer", "minimum": 1, "maximum": 9}},
                    "required": ["qty"],
                    "additionalProperties": False,
                },
            },
        },
    }
)
# A browser page of another origin, and what it asks before calling the API with a key.
ORIGIN = "https://chatparity-conformance.example"
PREFLIGHT = ChatProbe(
    method="OPTIONS",
    headers=(
        ("Origin", ORIGIN),
        ("Access-Control-Request-Method", "POST"),
        ("Access-Control-Request-Headers", "authorization,content-type"),
    ),
)
FROM_A_PAGE = ChatProbe(headers=(("Origin", ORIGIN),))
REFUSAL_WITHOUT_TEXT = [
    *HELLO,
    {"role": "assistant", "content": [{"type": "refusal"}]},
    {"role": "user", "content": "Try again."},
]


# Reading responses.


@dataclass
class Stream:
    """A server-sent event stream, split into its JSON chunks."""

    chunks: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    problems: list[str] = field(default_factory=list)
    """What is wrong with the framing itself."""


def parse_stream(body: bytes) -> Stream:
    """Split ``body`` into ``data:`` events as OpenAI frames them: each event one
    ``data: <json>`` line and a blank line, comment lines allowed, ``data: [DONE]`` last."""
    stream = Stream()
    problems = Problems()
    if b"\r" in body:
        problems.add("events use CR line endings; OpenAI separates them with \\n\\n")
        body = body.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    if body and not body.endswith(b"\n\n"):
        problems.add("the stream does not end with a blank line")
    for event in body.split(b"\n\n"):
        lines = [line for line in event.split(b"\n") if line and not line.startswith(b":")]
        if not lines:
            continue  # keepalive comments, or the end of the body
        if len(lines) != 1 or not lines[0].startswith(b"data: "):
            problems.add(
                f"event is not one 'data: ' line: {short(event.decode('utf-8', 'replace'))}"
            )
            continue
        if stream.done:
            problems.add("events after data: [DONE]")
        payload = lines[0][len(b"data: ") :]
        if payload == b"[DONE]":
            stream.done = True
            continue
        try:
            chunk = json.loads(payload)
        except ValueError:
            problems.add(f"data is not JSON: {short(payload.decode('utf-8', 'replace'))}")
            continue
        if not isinstance(chunk, dict):
            problems.add(f"data is not a JSON object: {short(chunk)}")
        elif "error" in chunk and "choices" not in chunk:
            stream.errors.append(chunk)
        else:
            stream.chunks.append(chunk)
    if not stream.done:
        problems.add("no data: [DONE] at the end")
    for error in stream.errors:
        problems.add(f"error frame: {short(error.get('error'))}")
    stream.problems = problems.render()
    return stream


def stream_body(response: httpx.Response) -> tuple[Stream | None, list[str]]:
    """A 200 stream, parsed, or the problems that stop it being judged."""
    problems = status_code_problems(response)
    return (None, problems) if problems else (parse_stream(response.content), [])


@dataclass
class Folded:
    """One choice of a stream, accumulated."""

    content: str = ""
    finish_reason: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    """Every ``tool_calls`` entry of every delta, in order."""


def fold(stream: Stream) -> dict[int, Folded]:
    """The stream's choices by index, leniently accumulated (malformed parts skipped)."""
    folded: dict[int, Folded] = {}
    for chunk in stream.chunks:
        for choice in _choices(chunk):
            state = folded.setdefault(choice.get("index", -1), Folded())
            delta = choice.get("delta")
            delta = delta if isinstance(delta, dict) else {}
            if isinstance(delta.get("content"), str):
                state.content += delta["content"]
            calls = delta.get("tool_calls")
            state.tool_calls += [c for c in calls if isinstance(c, dict)] if calls else []
            if choice.get("finish_reason") is not None:
                state.finish_reason = choice["finish_reason"]
    return folded


def _choices(chunk: dict[str, Any]) -> list[dict[str, Any]]:
    choices = chunk.get("choices")
    return [c for c in choices if isinstance(c, dict)] if isinstance(choices, list) else []


def usage_chunk(stream: Stream) -> dict[str, Any] | None:
    """The stream's usage object, if its last chunk is a usage chunk."""
    last = stream.chunks[-1] if stream.chunks else {}
    usage = last.get("usage")
    return usage if last.get("choices") == [] and isinstance(usage, dict) else None


# What a response must look like. Each returns problems; none means conformant.


def usage_problems(usage: Any) -> list[str]:
    """A full usage object: counts that add up, and both details objects."""
    if not isinstance(usage, dict):
        return [f"usage is {short(usage)}, expected an object"]
    problems = [
        f"usage.{key} is {short(usage.get(key))}, expected an integer"
        for key in ("prompt_tokens", "completion_tokens", "total_tokens")
        if not is_int(usage.get(key))
    ]
    if (
        not problems
        and usage["total_tokens"] != usage["prompt_tokens"] + usage["completion_tokens"]
    ):
        problems.append(
            f"usage.total_tokens {usage['total_tokens']} is not prompt_tokens"
            f" {usage['prompt_tokens']} + completion_tokens {usage['completion_tokens']}"
        )
    for name, keys in USAGE_DETAILS.items():
        details = usage.get(name)
        if not isinstance(details, dict):
            problems.append(f"usage.{name} is {short(details)}, expected an object")
            continue
        missing = [key for key in keys if not is_int(details.get(key))]
        if missing:
            problems.append(f"usage.{name} lacks integer {', '.join(missing)}")
    return problems


def completion_envelope_problems(body: dict[str, Any], model: str) -> list[str]:
    """``id``, ``object``, ``created``, ``model`` echoed, ``system_fingerprint``, ``choices``."""
    problems = []
    if not isinstance(body.get("id"), str) or not body["id"]:
        problems.append(f"id is {short(body.get('id'))}, expected a string")
    if body.get("object") != "chat.completion":
        problems.append(f"object is {short(body.get('object'))}, expected 'chat.completion'")
    if not is_int(body.get("created")):
        problems.append(f"created is {short(body.get('created'))}, expected an integer")
    if body.get("model") != model:
        problems.append(f"model is {short(body.get('model'))}, expected the requested {model!r}")
    if "system_fingerprint" not in body:
        problems.append("no system_fingerprint key")
    if not isinstance(body.get("choices"), list) or not body["choices"]:
        problems.append(f"choices is {short(body.get('choices'))}, expected a non-empty list")
    return problems


def completion_choice_problems(body: dict[str, Any], *, tools: bool = False) -> list[str]:
    """Each choice: ``index``, ``message`` (role, content, ``refusal: null``,
    ``annotations: []``, and ``tool_calls`` when ``tools``), ``logprobs``, ``finish_reason``."""
    problems = []
    choices = body.get("choices")
    for position, choice in enumerate(choices if isinstance(choices, list) else []):
        where = f"choices[{position}]"
        if not isinstance(choice, dict):
            problems.append(f"{where} is {short(choice)}, expected an object")
            continue
        if choice.get("index") != position:
            problems.append(f"{where}.index is {short(choice.get('index'))}, expected {position}")
        missing = sorted({"index", "message", "logprobs", "finish_reason"} - choice.keys())
        if missing:
            problems.append(f"{where} lacks {', '.join(missing)}")
        if choice.get("finish_reason") not in FINISH_REASONS:
            problems.append(f"{where}.finish_reason is {short(choice.get('finish_reason'))}")
        message = choice.get("message")
        if not isinstance(message, dict):
            problems.append(f"{where}.message is {short(message)}, expected an object")
            continue
        expected: dict[str, Any] = {"role": "assistant", "refusal": None, "annotations": []}
        problems += [
            f"{field_is(message, key, where + '.message')}, expected {short(value)}"
            for key, value in expected.items()
            if key not in message or message[key] != value
        ]
        if tools:
            if message.get("content", OMIT) is not None:
                problems.append(
                    f"{field_is(message, 'content', where + '.message')}, expected null"
                )
            problems += tool_call_problems(message.get("tool_calls"), where=f"{where}.message")
        elif not isinstance(message.get("content"), str):
            problems.append(
                f"{field_is(message, 'content', where + '.message')}, expected a string"
            )
    return problems


def tool_call_problems(calls: Any, *, where: str) -> list[str]:
    """A complete ``tool_calls`` list: ids, ``type: function``, JSON-object arguments."""
    if not isinstance(calls, list) or not calls:
        return [f"{where}.tool_calls is {short(calls)}, expected a call to get_weather"]
    problems = []
    for position, call in enumerate(calls):
        at = f"{where}.tool_calls[{position}]"
        if not isinstance(call, dict):
            problems.append(f"{at} is {short(call)}")
            continue
        if not isinstance(call.get("id"), str) or not call["id"]:
            problems.append(f"{at}.id is {short(call.get('id'))}")
        if call.get("type") != "function":
            problems.append(f"{at}.type is {short(call.get('type'))}, expected 'function'")
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        if function.get("name") != "get_weather":
            problems.append(f"{at}.function.name is {short(function.get('name'))}")
        problems += _arguments_problems(function.get("arguments"), at=at)
    return problems


def _arguments_problems(arguments: Any, *, at: str) -> list[str]:
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return []
    return [f"{at} arguments are not a JSON object: {short(arguments)}"]


def stream_envelope_problems(stream: Stream, model: str) -> list[str]:
    """Every chunk: same ``id`` and ``created``, the requested ``model``, the chunk
    ``object``, and the ``system_fingerprint`` and ``service_tier`` keys."""
    problems = Problems()
    if not stream.chunks:
        return ["no chunks"]
    first = stream.chunks[0]
    if not isinstance(first.get("id"), str) or not first["id"]:
        problems.add(f"id is {short(first.get('id'))}, expected a string", 0)
    if not is_int(first.get("created")):
        problems.add(f"created is {short(first.get('created'))}, expected an integer", 0)
    for number, chunk in enumerate(stream.chunks):
        if chunk.get("object") != "chat.completion.chunk":
            problems.add(
                f"object is {short(chunk.get('object'))}, not 'chat.completion.chunk'", number
            )
        for key in ("id", "created"):
            if chunk.get(key) != first.get(key):
                problems.add(f"{key} changes from {short(first.get(key))}", number)
        if chunk.get("model") != model:
            problems.add(f"model is {short(chunk.get('model'))}, expected {model!r}", number)
        for key in ("system_fingerprint", "service_tier"):
            if key not in chunk:
                problems.add(f"no {key} key", number)
        if not isinstance(chunk.get("choices"), list):
            problems.add(f"choices is {short(chunk.get('choices'))}, expected a list", number)
    return problems.render()


def stream_choice_problems(stream: Stream) -> list[str]:
    """Per choice: role chunk first, then bare content or tool-call deltas with
    ``finish_reason: null``, then one finisher with ``delta: {}``, then nothing."""
    problems = Problems()
    folded = fold(stream)
    opened: set[int] = set()
    finished: set[int] = set()
    for number, chunk in enumerate(stream.chunks):
        choices = chunk.get("choices")
        if choices == [] and chunk.get("usage") is None:
            problems.add("chunk with no choices and no usage", number)
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict):
                problems.add(f"choice is {short(choice)}, expected an object", number)
                continue
            if choice.keys() != CHOICE_KEYS:
                problems.add(
                    f"choice keys are {keys_of(choice)}, expected delta, finish_reason, index,"
                    " logprobs",
                    number,
                )
            index, delta = choice.get("index"), choice.get("delta")
            reason = choice.get("finish_reason")
            if not is_int(index) or not isinstance(delta, dict):
                problems.add(f"choice has index {short(index)}, delta {short(delta)}", number)
                continue
            label = f"choice {index}"
            if index in finished:
                problems.add(f"{label} has a chunk after its finisher", number)
            elif index not in opened:
                opened.add(index)
                expected = _role_delta(delta, tools=bool(folded.get(index, Folded()).tool_calls))
                if delta != expected:
                    problems.add(
                        f"{label} does not open with a role chunk {short(expected, 90)}:"
                        f" got {short(delta)}",
                        number,
                    )
                if reason is not None:
                    problems.add(f"{label}'s role chunk has finish_reason {short(reason)}", number)
            elif reason is not None:
                finished.add(index)
                if reason not in FINISH_REASONS:
                    problems.add(f"{label} finishes with unknown reason {short(reason)}", number)
                if delta != {}:
                    problems.add(
                        f"{label} has finish_reason {short(reason)} on a chunk with delta"
                        f" {short(delta)}, expected {{}}",
                        number,
                    )
            else:
                problem = _delta_problem(delta)
                if problem:
                    problems.add(f"{label}: {problem}", number)
    for index in sorted(opened - finished):
        problems.add(f"choice {index} has no finisher (finish_reason never set)")
    return problems.render()


def _role_delta(delta: dict[str, Any], *, tools: bool) -> dict[str, Any]:
    """The role chunk OpenAI sends: text answers open with empty content, tool
    calls with ``content: null`` and the call's first delta."""
    if not tools:
        return TEXT_ROLE_DELTA
    calls = delta.get("tool_calls")
    first = calls if isinstance(calls, list) and calls else ["<first delta of the call>"]
    return {"role": "assistant", "content": None, "tool_calls": first, "refusal": None}


def _delta_problem(delta: dict[str, Any]) -> str | None:
    """What is wrong with a delta between the role chunk and the finisher."""
    if delta.get("role") is not None:
        return f"role repeated after the role chunk: {short(delta)}"
    allowed = {"content", "tool_calls", "refusal"}
    if len(delta) != 1 or not delta.keys() <= allowed or None in delta.values():
        return f"delta is {short(delta)}, expected just one of content, tool_calls, refusal"
    return None


def stream_usage_problems(stream: Stream, *, include_usage: bool) -> list[str]:
    """With include_usage: ``usage: null`` on every chunk but the last, which is
    ``choices: []`` and a full usage object. Without: no ``usage`` key at all."""
    problems = Problems()
    if not include_usage:
        for number, chunk in enumerate(stream.chunks):
            if "usage" in chunk:
                problems.add("usage key present though include_usage was not requested", number)
        return problems.render()
    if not stream.chunks:
        return ["no chunks"]
    *body, last = stream.chunks
    for number, chunk in enumerate(body):
        if "usage" not in chunk:
            problems.add("no usage key (must be null until the usage chunk)", number)
        elif chunk["usage"] is not None:
            problems.add(f"usage is {short(chunk['usage'])} before the last chunk", number)
    if last.get("choices") != []:
        problems.add("no usage chunk (choices: [] + usage) before [DONE]: include_usage ignored")
    else:
        problems.extend(f"usage chunk: {problem}" for problem in usage_problems(last.get("usage")))
    return problems.render()


def streamed_tool_call_problems(stream: Stream) -> list[str]:
    """Choice 0's tool calls: the first delta of a call carries ``index, id,
    type: function, function: {name, arguments: ""}``; later ones only ``index``
    and ``function.arguments``; the fragments add up to a JSON object."""
    problems = Problems()
    calls = fold(stream).get(0, Folded()).tool_calls
    if not calls:
        return ["no tool call was streamed"]
    arguments: dict[Any, str] = {}
    for entry in calls:
        index = entry.get("index")
        function = entry.get("function")
        function = function if isinstance(function, dict) else {}
        if index not in arguments:
            arguments[index] = ""
            if entry.keys() != {"index", "id", "type", "function"}:
                problems.add(f"first delta of call {index} has keys {keys_of(entry)}")
            if not isinstance(entry.get("id"), str) or entry.get("type") != "function":
                problems.add(f"first delta of call {index} has id/type {short(entry)}")
            if function != {"name": "get_weather", "arguments": ""}:
                problems.add(
                    f"first delta of call {index} has function {short(function)},"
                    ' expected {"name":"get_weather","arguments":""}'
                )
        elif entry.keys() != {"index", "function"} or function.keys() != {"arguments"}:
            problems.add(
                f"later deltas of call {index} carry more than index and function.arguments:"
                f" {short(entry, 90)}"
            )
        if isinstance(function.get("arguments"), str):
            arguments[index] += function["arguments"]
    for index, text in arguments.items():
        problems.extend(_arguments_problems(text, at=f"call {index}"))
    return problems.render()


# Judges: responses -> problems.


def judge_stream(*inspect: Callable[[Stream, str], list[str]]) -> Judge:
    """Judge one streamed response with ``inspect``."""
    return judge_parsed(stream_body, *inspect)


def _models(model: str, responses: Sequence[httpx.Response]) -> list[str]:
    _, data, problems = listed(responses[0], "a non-empty list")
    if data is None:
        return problems
    for position, entry in enumerate(data):
        entry = entry if isinstance(entry, dict) else {}
        expected = {"id": str, "object": str, "created": int, "owned_by": str}
        wrong = [key for key, kind in expected.items() if not isinstance(entry.get(key), kind)]
        if wrong or entry.get("object") != "model":
            problems.append(f"data[{position}] lacks or mistypes {', '.join(wrong) or 'object'}")
    return problems


def _framing(stream: Stream, model: str) -> list[str]:
    return stream.problems


def _content_type(model: str, responses: Sequence[httpx.Response]) -> list[str]:
    kind = responses[0].headers.get("content-type", "")
    if responses[0].status_code == 200 and not kind.startswith("text/event-stream"):
        return [f"Content-Type is {kind!r}, expected text/event-stream"]
    return []


def _finish(reason: Any, expected: str) -> list[str]:
    return (
        [] if reason == expected else [f"finish_reason is {short(reason)}, expected {expected!r}"]
    )


def _truncated(reason: Any, usage: Any) -> list[str]:
    """What ``max_tokens: LENGTH_TOKENS`` must give: ``length``, that many tokens."""
    problems = _finish(reason, "length")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if usage is None:
        problems.append("no usage to count completion tokens")
    elif tokens != LENGTH_TOKENS:
        problems.append(f"usage.completion_tokens is {short(tokens)}, expected {LENGTH_TOKENS}")
    return problems


def _first_choice(body: dict[str, Any]) -> dict[str, Any]:
    choices = body.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else {}
    return first if isinstance(first, dict) else {}


def _length_completion(body: dict[str, Any], model: str) -> list[str]:
    return _truncated(_first_choice(body).get("finish_reason"), body.get("usage"))


def _length_stream(stream: Stream, model: str) -> list[str]:
    return _truncated(fold(stream).get(0, Folded()).finish_reason, usage_chunk(stream))


def _parity(model: str, responses: Sequence[httpx.Response]) -> list[str]:
    """Non-stream and stream (with usage) at temperature 0 say the same thing."""
    body, problems = json_body(responses[0])
    stream, stream_problems = stream_body(responses[1])
    if body is None or stream is None:
        return problems + stream_problems
    choice = _first_choice(body)
    message = choice.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    streamed = fold(stream).get(0, Folded())
    if content != streamed.content:
        problems.append(
            f"content differs: {short(content, 40)} vs streamed {short(streamed.content, 40)}"
        )
    if choice.get("finish_reason") != streamed.finish_reason:
        problems.append(
            f"finish_reason {short(choice.get('finish_reason'))} vs streamed"
            f" {short(streamed.finish_reason)}"
        )
    usage, streamed_usage = body.get("usage"), usage_chunk(stream)
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if streamed_usage is None:
        problems.append("the stream has no usage chunk to compare completion_tokens with")
    elif tokens != streamed_usage.get("completion_tokens"):
        problems.append(
            f"completion_tokens {short(tokens)} vs streamed"
            f" {short(streamed_usage.get('completion_tokens'))}"
        )
    return problems


def _two_completions(body: dict[str, Any], model: str) -> list[str]:
    choices = body.get("choices")
    indices = (
        [c.get("index") for c in choices if isinstance(c, dict)]
        if isinstance(choices, list)
        else []
    )
    return [] if indices == [0, 1] else [f"choice indices are {short(indices)}, expected [0, 1]"]


def _two_streamed(stream: Stream, model: str) -> list[str]:
    indices = sorted(fold(stream), key=str)
    problems = (
        [] if indices == [0, 1] else [f"choice indices are {short(indices)}, expected [0, 1]"]
    )
    return problems + stream_choice_problems(stream)


def _streamed_tools(expected_reason: str) -> Callable[[Stream, str], list[str]]:
    def inspect(stream: Stream, model: str) -> list[str]:
        reason = fold(stream).get(0, Folded()).finish_reason
        problems = streamed_tool_call_problems(stream) + stream_choice_problems(stream)
        return problems + _finish(reason, expected_reason)

    return inspect


def _completed_tools(body: dict[str, Any], model: str) -> list[str]:
    reason = _first_choice(body).get("finish_reason")
    return completion_choice_problems(body, tools=True) + _finish(reason, "tool_calls")


def _bounded_order(body: dict[str, Any], model: str) -> list[str]:
    """The answer is JSON whose ``qty`` keeps to the schema's bounds, 1 to 9, though the
    prompt asks for 25."""
    message = _first_choice(body).get("message")
    content = message.get("content") if isinstance(message, dict) else None
    try:
        answer = json.loads(content) if isinstance(content, str) else None
    except ValueError:
        answer = None
    quantity = answer.get("qty") if isinstance(answer, dict) else None
    if not is_int(quantity):
        return [f"content is {short(content)}, expected JSON with an integer qty"]
    return [] if 1 <= quantity <= 9 else [f"qty is {quantity}, outside the schema's 1 to 9"]


def function_call_problems(message: Any, *, where: str) -> list[str]:
    """A message answering with the deprecated ``function_call``: ``content: null``,
    ``function_call: {name, arguments}`` (arguments a JSON object), no ``tool_calls``."""
    if not isinstance(message, dict):
        return [f"{where} is {short(message)}, expected an object"]
    problems = []
    if message.get("content", OMIT) is not None:
        problems.append(f"{field_is(message, 'content', where)}, expected null")
    if message.get("tool_calls") is not None:
        problems.append(f"{where}.tool_calls is {short(message['tool_calls'])}, expected none")
    call = message.get("function_call")
    if not isinstance(call, dict) or call.keys() != {"name", "arguments"}:
        return [
            *problems,
            f"{field_is(message, 'function_call', where)}, expected {{name, arguments}}",
        ]
    if call["name"] != "get_weather":
        problems.append(f"{where}.function_call.name is {short(call['name'])}")
    return problems + _arguments_problems(call["arguments"], at=f"{where}.function_call")


def _completed_function_call(expected_reason: str) -> Callable[[dict[str, Any], str], list[str]]:
    def inspect(body: dict[str, Any], model: str) -> list[str]:
        choice = _first_choice(body)
        message = choice.get("message")
        problems = function_call_problems(message, where="choices[0].message")
        return problems + _finish(choice.get("finish_reason"), expected_reason)

    return inspect


def _chosen_function_call(body: dict[str, Any], model: str) -> list[str]:
    """function_call auto: a call finishes with ``function_call``, text with ``stop`` or
    ``length``."""
    choice = _first_choice(body)
    message = choice.get("message")
    reason = choice.get("finish_reason")
    if isinstance(message, dict) and message.get("function_call") is not None:
        problems = function_call_problems(message, where="choices[0].message")
        return problems + _finish(reason, "function_call")
    return completion_choice_problems(body) + (
        [] if reason in ("stop", "length") else [f"a text answer finishes with {short(reason)}"]
    )


def _no_function_call(body: dict[str, Any], model: str) -> list[str]:
    """function_call none: a text answer, no call."""
    message = _first_choice(body).get("message")
    call = message.get("function_call") if isinstance(message, dict) else None
    called = [] if call is None else [f"function_call is {short(call)}, expected none"]
    return completion_choice_problems(body) + called


def streamed_function_call_problems(stream: Stream, expected_reason: str) -> list[str]:
    """Choice 0 streams a deprecated ``function_call``: the role chunk carries
    ``content: null`` and ``function_call: {name, arguments: ""}``, each later delta only
    ``function_call.arguments``, which add up to a JSON object; then one finisher."""
    problems = Problems()
    deltas = [
        (number, choice)
        for number, chunk in enumerate(stream.chunks)
        for choice in _choices(chunk)
        if choice.get("index") == 0
    ]
    if not deltas:
        return ["no chunk for choice 0"]
    opening = {
        "role": "assistant",
        "content": None,
        "function_call": {"name": "get_weather", "arguments": ""},
        "refusal": None,
    }
    arguments = ""
    *middle, (_, last) = deltas
    for position, (number, choice) in enumerate(middle):
        delta = choice.get("delta")
        if choice.get("finish_reason") is not None:
            problems.add(f"finish_reason {short(choice['finish_reason'])} before the end", number)
        if position == 0:
            if delta != opening:
                problems.add(f"role chunk is {short(delta, 90)}, expected {short(opening, 90)}")
            continue
        call = delta.get("function_call") if isinstance(delta, dict) else None
        if not isinstance(delta, dict) or delta.keys() != {"function_call"}:
            problems.add(f"delta is {short(delta)}, expected just function_call", number)
        elif not isinstance(call, dict) or call.keys() != {"arguments"}:
            problems.add(f"function_call delta is {short(call)}, expected just arguments", number)
        if isinstance(call, dict) and isinstance(call.get("arguments"), str):
            arguments += call["arguments"]
    if last.get("delta") != {}:
        problems.add(f"the finisher's delta is {short(last.get('delta'))}, expected {{}}")
    problems.extend(_finish(last.get("finish_reason"), expected_reason))
    problems.extend(_arguments_problems(arguments, at="the streamed function_call"))
    return problems.render()


def _streamed_function_call(expected_reason: str) -> Callable[[Stream, str], list[str]]:
    return lambda stream, model: streamed_function_call_problems(stream, expected_reason)


def _preflight(model: str, responses: Sequence[httpx.Response]) -> list[str]:
    """A browser's preflight is granted: 2xx, the page's origin allowed (or any), POST and
    the ``authorization`` and ``content-type`` headers allowed."""
    response = responses[0]
    problems = [] if response.is_success else [f"HTTP {response.status_code}, expected 2xx"]
    problems += _allowed_origin(response)
    methods = _header_list(response, "access-control-allow-methods")
    if not methods & {"post", "*"}:
        problems.append(f"Access-Control-Allow-Methods is {short(sorted(methods))}, lacks POST")
    granted = _header_list(response, "access-control-allow-headers")
    # A wildcard grants every header but Authorization, which must be named.
    wanted = {"authorization"} if "*" in granted else {"authorization", "content-type"}
    missing = sorted(wanted - granted)
    if missing:
        problems.append(f"Access-Control-Allow-Headers lacks {', '.join(missing)}")
    return problems


def _from_a_page(model: str, responses: Sequence[httpx.Response]) -> list[str]:
    """A completion asked from another origin's page says the page may read it."""
    return status_code_problems(responses[0]) + _allowed_origin(responses[0])


def _allowed_origin(response: httpx.Response) -> list[str]:
    allowed = response.headers.get("access-control-allow-origin")
    if allowed in (ORIGIN, "*"):
        return []
    return [f"Access-Control-Allow-Origin is {short(allowed)}, expected {ORIGIN!r} or '*'"]


def _header_list(response: httpx.Response, name: str) -> set[str]:
    return {part.strip().lower() for part in response.headers.get(name, "").split(",") if part}


# The table.


def _check(name: str, description: str, judge: Judge, *probes: Probe) -> Check:
    return Check(name, description, probes, judge)


CHECKS: tuple[Check, ...] = (
    _check("models.list", "GET /models lists model objects", _models, MODELS),
    _check(
        "nonstream.envelope",
        "id, object, created, model echoed, system_fingerprint",
        judge_json(completion_envelope_problems),
        COMPLETION,
    ),
    _check(
        "nonstream.message",
        "choices[i]: index, message{role, content, refusal, annotations}, logprobs, finish_reason",
        judge_json(lambda body, model: completion_choice_problems(body)),
        COMPLETION,
    ),
    _check(
        "nonstream.usage",
        "usage counts add up, with both details objects",
        judge_json(lambda body, model: usage_problems(body.get("usage"))),
        COMPLETION,
    ),
    _check(
        "stream.framing",
        "text/event-stream; data: <json> events; data: [DONE] last",
        judge_all(_content_type, judge_stream(_framing)),
        STREAM,
    ),
    _check(
        "stream.envelope",
        "every chunk: same id/created, model echoed, object, system_fingerprint, service_tier",
        judge_stream(stream_envelope_problems),
        STREAM,
    ),
    _check(
        "stream.choices",
        "role chunk, deltas, one finisher with delta {} per choice",
        judge_stream(lambda stream, model: stream_choice_problems(stream)),
        STREAM,
    ),
    _check(
        "stream.no-usage",
        "no usage key when include_usage was not requested",
        judge_stream(lambda stream, model: stream_usage_problems(stream, include_usage=False)),
        STREAM,
    ),
    _check(
        "usage.stream",
        "include_usage: usage null on every chunk, then choices [] + usage before [DONE]",
        judge_stream(lambda stream, model: stream_usage_problems(stream, include_usage=True)),
        STREAM_USAGE,
    ),
    _check(
        "parity.stream-vs-nonstream",
        "temperature 0: same content, finish_reason, completion_tokens",
        _parity,
        COMPLETION,
        STREAM_USAGE,
    ),
    _check(
        "length.nonstream",
        f"max_tokens {LENGTH_TOKENS}: finish_reason length, {LENGTH_TOKENS} completion tokens",
        judge_json(_length_completion),
        LENGTH,
    ),
    _check(
        "length.stream",
        f"max_tokens {LENGTH_TOKENS}: finish_reason length, {LENGTH_TOKENS} completion tokens",
        judge_stream(_length_stream),
        LENGTH_STREAM,
    ),
    _check("n.nonstream", "n 2: choices 0 and 1", judge_json(_two_completions), N2),
    _check(
        "n.stream",
        "n 2: both indices, each with a role chunk and one finisher",
        judge_stream(_two_streamed),
        N2_STREAM,
    ),
    _check(
        "tools.required.stream",
        "tool_choice required: OpenAI's tool-call deltas, finish_reason tool_calls",
        judge_stream(_streamed_tools("tool_calls")),
        _tools("required", stream=True),
    ),
    _check(
        "tools.named.stream",
        "named tool_choice: OpenAI's tool-call deltas, finish_reason stop",
        judge_stream(_streamed_tools("stop")),
        _tools(NAMED_TOOL, stream=True),
    ),
    _check(
        "tools.required.nonstream",
        "tool_choice required: message.tool_calls, content null, finish_reason tool_calls",
        judge_json(_completed_tools),
        _tools("required", stream=False),
    ),
    _check(
        "errors.missing-messages",
        "no messages: 400, param messages",
        judge_error(400, type=INVALID, param="messages"),
        ChatProbe({"messages": OMIT, "max_tokens": 1}),
    ),
    _check(
        "errors.bad-key",
        "a bad key: 401 invalid_api_key",
        judge_error(401, type=INVALID, code="invalid_api_key"),
        ChatProbe({"max_tokens": 1}, bad_key=True),
    ),
    _check(
        "errors.unknown-model",
        "an unknown model: 404 model_not_found",
        judge_error(404, type=INVALID, code="model_not_found"),
        ChatProbe({"model": UNKNOWN_MODEL, "max_tokens": 1}),
    ),
    _check(
        "errors.stream-status",
        "stream: true with a bad request: a real 400, not a 200 stream",
        judge_error(400, type=INVALID),
        ChatProbe({"stream": True, "temperature": 3, "max_tokens": 1}),
    ),
    _check(
        "errors.unknown-argument",
        "an unknown argument: 400 Unrecognized request argument",
        judge_error(
            400,
            type=INVALID,
            message=f"Unrecognized request argument supplied: {UNKNOWN_ARGUMENT}",
        ),
        ChatProbe({UNKNOWN_ARGUMENT: True, "max_tokens": 1}),
    ),
    _check(
        "errors.temperature",
        "temperature 3: 400, param temperature",
        judge_error(400, type=INVALID, param="temperature"),
        ChatProbe({"temperature": 3, "max_tokens": 1}),
    ),
    _check(
        "schema.numeric-bounds",
        "strict json_schema: an integer keeps to its minimum and maximum",
        judge_json(_bounded_order),
        BOUNDED_ORDER,
    ),
    _check(
        "functions.named.nonstream",
        "deprecated function_call named: message.function_call, content null, finish stop",
        judge_json(_completed_function_call("stop")),
        _functions({"name": "get_weather"}),
    ),
    _check(
        "functions.named.stream",
        "deprecated function_call named: function_call deltas, finish stop",
        judge_stream(_streamed_function_call("stop")),
        _functions({"name": "get_weather"}, stream=True),
    ),
    _check(
        "functions.auto.nonstream",
        "deprecated function_call auto: a call finishes with function_call, text with stop",
        judge_json(_chosen_function_call),
        _functions("auto"),
    ),
    _check(
        "functions.none.nonstream",
        "deprecated function_call none: a text answer",
        judge_json(_no_function_call),
        _functions("none"),
    ),
    _check(
        "cors.preflight",
        "a browser's preflight from another origin: granted POST with authorization",
        _preflight,
        PREFLIGHT,
    ),
    _check(
        "cors.response",
        "a completion asked from another origin's page: Access-Control-Allow-Origin",
        _from_a_page,
        FROM_A_PAGE,
    ),
    _check(
        "stop.empty-list",
        "stop []: accepted",
        judge_json(completion_envelope_problems),
        ChatProbe({"stop": [], "max_tokens": 1}),
    ),
    _check(
        "errors.metadata-without-store",
        "metadata without store: 400, param metadata",
        judge_error(
            400,
            type=INVALID,
            param="metadata",
            message="The 'metadata' parameter is only allowed when 'store' is enabled.",
        ),
        ChatProbe({"metadata": {"run": "1"}, "max_tokens": 1}),
    ),
    _check(
        "errors.metadata-long-key",
        "a metadata key of 65 characters: 400 property_name_above_max_length, param the key's",
        judge_error(
            400,
            type=INVALID,
            param="metadata." + "k" * 65,
            code="property_name_above_max_length",
        ),
        ChatProbe({"store": True, "metadata": {"k" * 65: "v"}, "max_tokens": 1}),
    ),
    _check(
        "errors.logit-bias-range",
        "a logit_bias of 200: 400, param logit_bias, code null",
        judge_error(
            400,
            type=INVALID,
            param="logit_bias",
            code=None,
            message="Logit bias value 200.0 is invalid or outside of range [-100, 100]",
        ),
        ChatProbe({"logit_bias": {"12345": 200}, "max_tokens": 1}),
    ),
    _check(
        "errors.modalities",
        "modalities ['UNKNOWN']: 400 invalid_value",
        judge_error(400, type=INVALID, code="invalid_value"),
        ChatProbe({"modalities": ["UNKNOWN"], "max_tokens": 1}),
    ),
    _check(
        "errors.audio-format",
        "an unknown audio.format: 400 invalid_value, param audio.format",
        judge_error(400, type=INVALID, param="audio.format", code="invalid_value"),
        ChatProbe({"audio": {"voice": "alloy", "format": "bogus"}, "max_tokens": 1}),
    ),
    _check(
        "errors.max-tokens-combination",
        "max_tokens and max_completion_tokens: 400 invalid_parameter_combination",
        judge_error(400, type=INVALID, code="invalid_parameter_combination"),
        ChatProbe({"max_tokens": 1, "max_completion_tokens": 1}),
    ),
    _check(
        "errors.empty-model-first",
        "model '' and no messages: the model is reported first",
        judge_error(400, type=INVALID, message="you must provide a model parameter"),
        ChatProbe({"model": "", "messages": OMIT}),
    ),
    _check(
        "errors.unknown-model-first",
        "an unknown model and no messages: 404 model_not_found first",
        judge_error(404, type=INVALID, code="model_not_found"),
        ChatProbe({"model": UNKNOWN_MODEL, "messages": OMIT}),
    ),
    _check(
        "errors.check-order",
        "top_logprobs without logprobs before stream_options without stream",
        judge_error(400, type=INVALID, param="top_logprobs"),
        ChatProbe({"top_logprobs": 2, "stream_options": {"include_usage": True}, "max_tokens": 1}),
    ),
    _check(
        "errors.refusal-part",
        "an assistant refusal part without its text: 400 missing_required_parameter",
        judge_error(
            400,
            type=INVALID,
            param="messages[1].content[0].refusal",
            code="missing_required_parameter",
        ),
        ChatProbe({"messages": REFUSAL_WITHOUT_TEXT, "max_tokens": 1}),
    ),
)

"""The Chat Completions API's rows of the conformance table."""

__all__ = ["CHECKS", "ChatProbe", "Stream", "parse_stream"]
