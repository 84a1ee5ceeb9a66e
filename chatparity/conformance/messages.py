"""Conformance checks of Anthropic's Messages API (``POST /v1/messages`` and
``POST /v1/messages/count_tokens``).

Rows of :data:`CHECKS`, built on :mod:`.framework` as the chat checks are: raw
httpx probes (the key in ``x-api-key``, with ``anthropic-version``) and pure
judges. What Anthropic's API does, as the ``anthropic`` SDK's types and its
recorded streams show:

- A message: ``id`` (``msg_...``), ``type: "message"``, ``role: "assistant"``,
  ``model`` as asked, ``content`` blocks (``text``; ``tool_use`` with ``id``,
  ``name`` and an ``input`` object), ``stop_reason`` (``end_turn``,
  ``max_tokens``, ``stop_sequence``, ``tool_use``, ...), ``stop_sequence`` and
  ``usage`` (``input_tokens``, ``output_tokens``, the cache counts).
- A stream: server-sent events, each an ``event: <type>`` line and a ``data:``
  line whose ``type`` is that name; ``message_start`` (the message, its content
  empty, no stop reason), then for each block ``content_block_start`` (index 0,
  1, ...), its deltas (``text_delta``, ``input_json_delta``) and
  ``content_block_stop``, then ``message_delta`` (the stop reason, the usage)
  and ``message_stop``; a ``ping`` may come at any time; no ``[DONE]``.
- Errors: ``{"type": "error", "error": {"type", "message"}}`` (and a
  ``request_id``) with Anthropic's status and type, and a ``request-id`` header.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import httpx

from .framework import (
    BAD_KEY,
    GET_WEATHER,
    HELLO_PROMPT,
    OMIT,
    STORY_PROMPT,
    UNKNOWN_ARGUMENT,
    WEATHER_PROMPT,
    Check,
    Judge,
    Probe,
    Problems,
    is_int,
    json_body,
    judge_json,
    judge_parsed,
    keys_of,
    short,
    status_code_problems,
)

if TYPE_CHECKING:
    from .framework import Runner

ANTHROPIC_VERSION = "2023-06-01"
STOP_REASONS = (
    "end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal",
    "model_context_window_exceeded",
)  # fmt: skip
# The tool in Anthropic's shape: its schema under input_schema.
WEATHER_TOOL: dict[str, Any] = {
    "name": GET_WEATHER["name"],
    "description": GET_WEATHER["description"],
    "input_schema": GET_WEATHER["parameters"],
}
MAX_TOKENS = 5
"""A long story is cut here: stop_reason max_tokens, that many output tokens."""
DELTA_TYPES = {"text": "text_delta", "tool_use": "input_json_delta", "thinking": "thinking_delta"}


# Requests.


@dataclass(frozen=True)
class MessagesProbe(Probe):
    """A ``POST /messages`` request, greedy, with the key as Anthropic's clients send it."""

    path: str = "/messages"
    defaults: ClassVar[Mapping[str, Any]] = {"max_tokens": 64, "temperature": 0}

    def send(self, runner: Runner) -> httpx.Response:
        bearer = runner.http.headers.get("authorization", "")
        key = BAD_KEY if self.bad_key else bearer.removeprefix("Bearer ")
        headers = {"x-api-key": key, "anthropic-version": ANTHROPIC_VERSION, **dict(self.headers)}
        request = runner.http.build_request(
            self.method, self.path, json=self.request_body(runner.model), headers=headers
        )
        del request.headers["authorization"]  # the key is in x-api-key alone
        return runner.http.send(request)


@dataclass(frozen=True)
class CountProbe(MessagesProbe):
    path: str = "/messages/count_tokens"
    defaults: ClassVar[Mapping[str, Any]] = {}


def _messages(prompt: str, body: Mapping[str, Any] | None = None, *, stream: bool = False) -> Probe:
    asked = {"messages": [{"role": "user", "content": prompt}], "stream": stream, **(body or {})}
    return MessagesProbe(asked)


MESSAGE = _messages(HELLO_PROMPT)
MESSAGE_STREAM = _messages(HELLO_PROMPT, stream=True)
CUT = {"max_tokens": MAX_TOKENS}
TOOL_USE = {"tools": [WEATHER_TOOL], "tool_choice": {"type": "any"}}


# Reading streams.


def _object(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty one (a part that is missing)."""
    return value if isinstance(value, dict) else {}


@dataclass
class MessageStream:
    """A Messages stream split into its events (the JSON ``data`` of each), pings aside."""

    events: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """What is wrong with the framing itself."""

    def message(self) -> dict[str, Any]:
        """The message the events add up to, as Anthropic's SDKs accumulate it."""
        message = dict(_object(self.events[0].get("message"))) if self.events else {}
        blocks: list[dict[str, Any]] = []
        arguments: dict[int, str] = {}
        for event in self.events[1:]:
            kind, index = event.get("type"), event.get("index")
            if kind == "content_block_start" and isinstance(event.get("content_block"), dict):
                blocks.append(dict(event["content_block"]))
            elif kind == "content_block_delta" and is_int(index) and 0 <= index < len(blocks):
                delta = _object(event.get("delta"))
                block = blocks[index]
                if delta.get("type") == "text_delta":
                    block["text"] = str(block.get("text", "")) + str(delta.get("text"))
                elif delta.get("type") == "input_json_delta":
                    arguments[index] = arguments.get(index, "") + str(delta.get("partial_json"))
            elif kind == "message_delta":
                delta = _object(event.get("delta"))
                message.update({key: delta.get(key) for key in ("stop_reason", "stop_sequence")})
                if isinstance(event.get("usage"), dict):
                    message["usage"] = {**_object(message.get("usage")), **event["usage"]}
        for index, text in arguments.items():
            try:
                blocks[index]["input"] = json.loads(text)
            except ValueError:
                blocks[index]["input"] = text
        message["content"] = blocks
        return message


def parse_message_stream(body: bytes) -> MessageStream:
    """Split ``body`` into events as Anthropic frames them: ``event: <type>`` then
    ``data: <json>`` whose ``type`` is the same, a blank line after each; pings and
    comments allowed."""
    stream = MessageStream()
    problems = Problems()
    if b"\r" in body:
        problems.add("events use CR line endings; Anthropic separates them with \\n\\n")
        body = body.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    if body and not body.endswith(b"\n\n"):
        problems.add("the stream does not end with a blank line")
    for number, block in enumerate(filter(None, body.split(b"\n\n"))):
        lines = [line for line in block.split(b"\n") if line and not line.startswith(b":")]
        if not lines:
            continue  # comments
        if lines == [b"data: [DONE]"]:
            problems.add("data: [DONE] sent; a Messages stream ends with message_stop")
            continue
        if len(lines) != 2 or not lines[0].startswith(b"event: "):
            problems.add(f"event is not an 'event:' line and a 'data:' line: {short(block)}")
        named = lines[0].removeprefix(b"event: ").decode("utf-8", "replace")
        data = lines[-1].removeprefix(b"data: ")
        try:
            event = json.loads(data) if lines[-1].startswith(b"data: ") else None
        except ValueError:
            event = None
        if not isinstance(event, dict):
            problems.add(f"data is not a JSON object: {short(data.decode('utf-8', 'replace'))}")
            continue
        if len(lines) == 2 and event.get("type") != named:
            problems.add(f"event: {named} carries type {short(event.get('type'))}", number)
        if event.get("type") != "ping":
            stream.events.append(event)
    stream.problems = problems.render()
    return stream


def message_stream(response: httpx.Response) -> tuple[MessageStream | None, list[str]]:
    """A 200 Messages stream, parsed, or the problems that stop it being judged."""
    problems = status_code_problems(response)
    if problems:
        return None, problems
    kind = response.headers.get("content-type", "")
    if not kind.startswith("text/event-stream"):
        problems.append(f"Content-Type is {kind!r}")
    stream = parse_message_stream(response.content)
    return stream, problems + stream.problems


# What a message must look like.


def usage_problems(usage: Any) -> list[str]:
    """Input and output tokens counted; the cache counts, when there, counts too."""
    if not isinstance(usage, dict):
        return [f"usage is {short(usage)}, expected an object"]
    problems = [
        f"usage.{key} is {short(usage.get(key))}, expected a count"
        for key in ("input_tokens", "output_tokens")
        if not is_int(usage.get(key)) or usage[key] < 0
    ]
    problems += [
        f"usage.{key} is {short(usage[key])}, expected a count or null"
        for key in ("cache_creation_input_tokens", "cache_read_input_tokens")
        if usage.get(key) is not None and (not is_int(usage[key]) or usage[key] < 0)
    ]
    return problems


def block_problems(block: Any, where: str) -> list[str]:
    """A content block of an answer: text, or a tool use with its input object."""
    if not isinstance(block, dict):
        return [f"{where} is {short(block)}, expected a content block"]
    kind = block.get("type")
    if kind == "text":
        return [] if isinstance(block.get("text"), str) else [f"{where}.text is not a string"]
    if kind == "tool_use":
        problems = [
            f"{where}.{key} is {short(block.get(key))}, expected a string"
            for key in ("id", "name")
            if not isinstance(block.get(key), str) or not block[key]
        ]
        if not isinstance(block.get("input"), dict):
            problems.append(f"{where}.input is {short(block.get('input'))}, not an object")
        return problems
    if kind in ("thinking", "redacted_thinking"):
        return []
    return [f"{where}.type is {short(kind)}, expected text, tool_use or thinking"]


def message_problems(body: dict[str, Any], model: str, *, started: bool = False) -> list[str]:
    """The message object: ids and names, its blocks, a stop reason (none yet when
    ``started``: message_start's), stop_sequence, usage."""
    problems = []
    if not isinstance(body.get("id"), str) or not body["id"].startswith("msg_"):
        problems.append(f"id is {short(body.get('id'))}, expected 'msg_...'")
    for key, value in (("type", "message"), ("role", "assistant"), ("model", model)):
        if body.get(key) != value:
            problems.append(f"{key} is {short(body.get(key))}, expected {value!r}")
    content = body.get("content")
    if not isinstance(content, list):
        problems.append(f"content is {short(content)}, expected a list of blocks")
    elif started and content:
        problems.append(f"message_start's content is {short(content)}, expected []")
    else:
        for position, block in enumerate(content):
            problems += block_problems(block, f"content[{position}]")
    stop = body.get("stop_reason", OMIT)
    if started and stop is not None:
        problems.append(f"message_start's stop_reason is {short(stop)}, expected null")
    elif not started and stop not in STOP_REASONS:
        problems.append(f"stop_reason is {short(stop)}, expected one of {', '.join(STOP_REASONS)}")
    if "stop_sequence" not in body:
        problems.append("no stop_sequence key")
    return problems + usage_problems(body.get("usage"))


def text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    return "".join(
        str(block.get("text"))
        for block in (content if isinstance(content, list) else [])
        if isinstance(block, dict) and block.get("type") == "text"
    )


def _stopped(
    reason: str, *, tokens: int | None = None
) -> Callable[[dict[str, Any], str], list[str]]:
    """A message that stopped for ``reason`` (and with ``tokens`` output tokens)."""

    def inspect(message: dict[str, Any], model: str) -> list[str]:
        problems = []
        if message.get("stop_reason") != reason:
            problems.append(
                f"stop_reason is {short(message.get('stop_reason'))}, expected {reason!r}"
            )
        usage = _object(message.get("usage"))
        if tokens is not None and usage.get("output_tokens") != tokens:
            problems.append(
                f"usage.output_tokens is {short(usage.get('output_tokens'))}, expected {tokens}"
            )
        return problems

    return inspect


def tool_use_problems(message: dict[str, Any], model: str) -> list[str]:
    """tool_choice any: a get_weather tool use with an input object, stop_reason tool_use."""
    content = message.get("content")
    uses = [
        block
        for block in (content if isinstance(content, list) else [])
        if isinstance(block, dict) and block.get("type") == "tool_use"
    ]
    if not uses:
        return [f"no tool_use block in content {short(content)}"]
    problems = block_problems(uses[0], "the tool_use block")
    if uses[0].get("name") != "get_weather":
        problems.append(f"the tool_use block's name is {short(uses[0].get('name'))}")
    return problems + _stopped("tool_use")(message, model)


def order_problems(stream: MessageStream, model: str) -> list[str]:
    """message_start; each block's start, deltas of its own type, stop, indices 0, 1, ...;
    message_delta with the stop reason and usage; message_stop last."""
    events = stream.events
    kinds = [event.get("type") for event in events]
    if not kinds or kinds[0] != "message_start":
        return [f"the stream opens with {short(kinds[:1])}, expected message_start"]
    problems = message_problems(_object(events[0].get("message")), model, started=True)
    if kinds[-2:] != ["message_delta", "message_stop"]:
        problems.append(
            f"the stream ends with {short(kinds[-2:])}, expected message_delta, message_stop"
        )
    problems += _block_order_problems(events[1:-2])
    ending = events[-2] if kinds[-2:-1] == ["message_delta"] else {}
    if ending and _object(ending.get("delta")).get("stop_reason") not in STOP_REASONS:
        problems.append(f"message_delta's delta is {short(ending.get('delta'))}")
    if ending and not is_int(_object(ending.get("usage")).get("output_tokens")):
        problems.append(f"message_delta's usage is {short(ending.get('usage'))}")
    return problems


def _block_order_problems(events: list[dict[str, Any]]) -> list[str]:
    """The events between message_start and message_delta: blocks one after another."""
    problems = []
    open_index: Any = None  # the index of the block open now
    open_type = ""
    started = 0
    for number, event in enumerate(events, start=1):
        kind, index = event.get("type"), event.get("index")
        where = f"event #{number}"
        if kind == "content_block_start":
            block = _object(event.get("content_block"))
            if open_index is not None or index != started:
                problems.append(f"{where}: a block starts at index {short(index)}, not {started}")
            if block.get("type") == "tool_use" and block.get("input") != {}:
                problems.append(
                    f"{where}: a tool_use starts with input {short(block.get('input'))}"
                )
            open_index, open_type = index, str(block.get("type"))
            started += 1
        elif kind == "content_block_delta":
            delta_type = _object(event.get("delta")).get("type")
            if open_index is None or index != open_index:
                problems.append(f"{where}: a delta of block {short(index)}, which is not open")
            elif delta_type not in (DELTA_TYPES.get(open_type), "signature_delta"):
                problems.append(f"{where}: a {short(delta_type)} in a {open_type} block")
        elif kind == "content_block_stop":
            if open_index is None or index != open_index:
                problems.append(f"{where}: a stop of block {short(index)}, which is not open")
            open_index = None
        else:
            problems.append(f"{where} is {short(kind)}, between message_start and message_delta")
    if open_index is not None:
        problems.append(f"block {short(open_index)} never stops")
    return problems


def parity_problems(model: str, responses: Sequence[httpx.Response]) -> list[str]:
    """The stream adds up to the non-stream message (temperature 0): text, stop reason,
    output tokens."""
    body, problems = json_body(responses[0])
    stream, stream_problems = message_stream(responses[1])
    if body is None or stream is None:
        return problems + stream_problems
    streamed = stream.message()
    if text_of(streamed) != text_of(body):
        problems.append(
            f"text differs: {short(text_of(body), 40)} vs streamed {short(text_of(streamed), 40)}"
        )
    stops = [body.get("stop_reason"), streamed.get("stop_reason")]
    if stops[0] != stops[1]:
        problems.append(f"stop_reason {short(stops[0])} vs streamed {short(stops[1])}")
    tokens = [
        (each.get("usage") or {}).get("output_tokens")
        if isinstance(each.get("usage"), dict)
        else None
        for each in (body, streamed)
    ]
    if tokens[0] != tokens[1]:
        problems.append(f"output_tokens {short(tokens[0])} vs streamed {short(tokens[1])}")
    return problems


def count_problems(body: dict[str, Any], model: str) -> list[str]:
    if (
        keys_of(body) != "input_tokens"
        or not is_int(body["input_tokens"])
        or body["input_tokens"] <= 0
    ):
        return [f'body is {short(body)}, expected {{"input_tokens": <a count above 0>}}']
    return []


# Judges.


def judge_stream(*inspect: Callable[[MessageStream, str], list[str]]) -> Judge:
    return judge_parsed(message_stream, *inspect)


def framing_problems(model: str, responses: Sequence[httpx.Response]) -> list[str]:
    return message_stream(responses[0])[1]


def _accumulated(
    inspect: Callable[[dict[str, Any], str], list[str]],
) -> Callable[[MessageStream, str], list[str]]:
    """``inspect`` the message a stream adds up to."""

    def check(stream: MessageStream, model: str) -> list[str]:
        return inspect(stream.message(), model)

    return check


def judge_error(status: int, kind: str) -> Judge:
    """An error before the first byte: HTTP ``status``, a ``request-id`` header, and
    Anthropic's envelope with error type ``kind``."""

    def judge(model: str, responses: Sequence[httpx.Response]) -> list[str]:
        body, problems = json_body(responses[0], status)
        if body is None:
            return problems
        if not responses[0].headers.get("request-id"):
            problems.append("no request-id header")
        error = body.get("error")
        if body.get("type") != "error" or not isinstance(error, dict):
            return [
                *problems,
                f'body is {short(body)}, expected {{"type": "error", "error": {{...}}}}',
            ]
        if body.keys() - {"type", "error", "request_id"}:
            problems.append(f"body keys are {keys_of(body)}, expected error, request_id, type")
        if error.keys() != {"type", "message"}:
            problems.append(f"error keys are {keys_of(error)}, expected message, type")
        if not isinstance(error.get("message"), str) or not error["message"]:
            problems.append(f"error.message is {short(error.get('message'))}")
        if error.get("type") != kind:
            problems.append(f"error.type is {short(error.get('type'))}, expected {kind!r}")
        return problems

    return judge


CHECKS: tuple[Check, ...] = (
    Check(
        "messages.object",
        "id msg_..., type message, role assistant, model echoed, blocks, stop_reason, usage",
        (MESSAGE,),
        judge_json(message_problems),
    ),
    Check(
        "messages.stream.framing",
        "text/event-stream; event: lines naming each data's type; no [DONE]",
        (MESSAGE_STREAM,),
        framing_problems,
    ),
    Check(
        "messages.stream.order",
        "message_start, each block's start/deltas/stop, message_delta, message_stop",
        (MESSAGE_STREAM,),
        judge_stream(order_problems),
    ),
    Check(
        "messages.parity",
        "the stream adds up to the non-stream message: text, stop_reason, output_tokens",
        (MESSAGE, MESSAGE_STREAM),
        parity_problems,
    ),
    Check(
        "messages.max-tokens",
        f"max_tokens {MAX_TOKENS}: stop_reason max_tokens, {MAX_TOKENS} output tokens",
        (_messages(STORY_PROMPT, CUT),),
        judge_json(_stopped("max_tokens", tokens=MAX_TOKENS)),
    ),
    Check(
        "messages.max-tokens.stream",
        f"max_tokens {MAX_TOKENS}, streamed: message_delta says max_tokens, {MAX_TOKENS} tokens",
        (_messages(STORY_PROMPT, CUT, stream=True),),
        judge_stream(_accumulated(_stopped("max_tokens", tokens=MAX_TOKENS))),
    ),
    Check(
        "messages.tool-use",
        "tool_choice any: a tool_use block with id, name, input object; stop_reason tool_use",
        (_messages(WEATHER_PROMPT, TOOL_USE),),
        judge_json(tool_use_problems),
    ),
    Check(
        "messages.tool-use.stream",
        "tool_choice any, streamed: tool_use starts with input {}, input_json_delta adds up",
        (_messages(WEATHER_PROMPT, TOOL_USE, stream=True),),
        judge_stream(order_problems, _accumulated(tool_use_problems)),
    ),
    Check(
        "messages.count-tokens",
        "count_tokens: {input_tokens: <a count>}",
        (CountProbe({"messages": [{"role": "user", "content": HELLO_PROMPT}]}),),
        judge_json(count_problems),
    ),
    Check(
        "messages.error.max-tokens",
        "no max_tokens: 400 invalid_request_error",
        (_messages(HELLO_PROMPT, {"max_tokens": OMIT}),),
        judge_error(400, "invalid_request_error"),
    ),
    Check(
        "messages.error.unknown-parameter",
        "an unknown parameter: 400 invalid_request_error",
        (_messages(HELLO_PROMPT, {UNKNOWN_ARGUMENT: True}),),
        judge_error(400, "invalid_request_error"),
    ),
    Check(
        "messages.error.stream-status",
        "stream: true with a bad request: a real 400, not a 200 stream",
        (_messages(HELLO_PROMPT, {"max_tokens": OMIT}, stream=True),),
        judge_error(400, "invalid_request_error"),
    ),
    Check(
        "messages.error.key",
        "a bad key: 401 authentication_error",
        (MessagesProbe(MESSAGE.body, bad_key=True),),
        judge_error(401, "authentication_error"),
    ),
    Check(
        "messages.error.model",
        "an unknown model: 404 not_found_error",
        (_messages(HELLO_PROMPT, {"model": "chatparity-conformance-no-such-model"}),),
        judge_error(404, "not_found_error"),
    ),
)
"""Anthropic's Messages API's rows of the conformance table."""

__all__ = ["CHECKS", "MessageStream", "MessagesProbe", "parse_message_stream"]
