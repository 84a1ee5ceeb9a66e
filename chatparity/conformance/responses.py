"""Conformance checks of the Responses API (``POST /v1/responses`` and the stored responses).

Rows of :data:`CHECKS`, built on :mod:`.framework` as the chat checks are: raw
httpx probes and pure judges. What OpenAI's Responses API does, as openai-python's
types and the API reference describe it:

- A response object: ``id`` (``resp_...``), ``object: "response"``, ``created_at``,
  ``status``, ``error``, ``incomplete_details``, ``model``, ``output`` items
  (``message`` with ``output_text`` parts; ``function_call`` with ``call_id``, ``name``,
  ``arguments``), the request's settings echoed, and ``usage``.
- A stream: server-sent events, each an ``event: <type>`` line and a ``data:`` line
  whose ``type`` is that same name, numbered by ``sequence_number`` from 0 without
  gaps; ``response.created``, ``response.in_progress``, then per output item
  ``response.output_item.added`` ... ``response.output_item.done``, ending with one
  ``response.completed``, ``response.incomplete`` or ``response.failed`` whose
  ``response`` is what the same request without ``stream`` returns. No ``[DONE]``.
- ``GET /responses/{id}``, ``GET /responses/{id}/input_items`` (a list with
  ``first_id``, ``last_id``, ``has_more``) and ``DELETE /responses/{id}``
  (``{"id", "object": "response", "deleted": true}``); then 404 in the error envelope.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from typing import TYPE_CHECKING, Any, ClassVar, TypeGuard

import httpx

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
    json_body,
    judge_error,
    judge_json,
    judge_parsed,
    listed,
    short,
    status_code_problems,
)

if TYPE_CHECKING:
    from .framework import Runner

# The function tool in the Responses shape (its fields at the top).
WEATHER_TOOL: dict[str, Any] = {"type": "function", **GET_WEATHER}
# OpenAI's smallest max_output_tokens: a long story stops there, incomplete.
MIN_OUTPUT_TOKENS = 16
TERMINAL = ("response.completed", "response.incomplete", "response.failed")
USAGE_DETAILS = {
    "input_tokens_details": "cached_tokens",
    "output_tokens_details": "reasoning_tokens",
}
# Settings a response object repeats from its request (OpenAI's Response type).
ECHOED = (
    "instructions", "max_output_tokens", "metadata", "parallel_tool_calls", "previous_response_id",
    "reasoning", "temperature", "text", "tool_choice", "tools", "top_p",
)  # fmt: skip


# Requests.


@dataclass(frozen=True)
class ResponsesProbe(Probe):
    """A ``POST /responses`` request: greedy, not stored, unless ``body`` says otherwise."""

    path: str = "/responses"
    defaults: ClassVar[Mapping[str, Any]] = {"temperature": 0, "store": False}


def _responses(body: dict[str, Any], *, stream: bool = False, bad_key: bool = False) -> Probe:
    return ResponsesProbe({**body, "stream": stream}, bad_key=bad_key)


ANSWER = {"input": HELLO_PROMPT, "max_output_tokens": 64}
INCOMPLETE = {"input": STORY_PROMPT, "max_output_tokens": MIN_OUTPUT_TOKENS}
FUNCTION_CALL = {
    "input": WEATHER_PROMPT,
    "tools": [WEATHER_TOOL],
    "tool_choice": "required",
    "max_output_tokens": 64,
}
RESPONSE = _responses(ANSWER)
RESPONSE_STREAM = _responses(ANSWER, stream=True)
STORED = _responses({**ANSWER, "store": True})


@dataclass(frozen=True)
class FollowUp(Probe):
    """A request about the response another probe (``after``) created, at ``path``
    with ``{id}`` in it; sent once that one was (each probe is sent once a run)."""

    after: Probe = field(default_factory=Probe)
    previous: Probe | None = None
    """A probe to send first (another follow-up), for the order of the run."""

    def cache_key(self, model: str) -> str:
        before = self.previous.cache_key(model) if self.previous else ""
        return f"{self.method} {self.path} after {self.after.cache_key(model)} then {before}"

    def send(self, runner: Runner) -> httpx.Response:
        if self.previous is not None:
            runner.send(self.previous)
        created = runner.send(self.after)
        try:
            response_id = created.json()["id"]
        except (ValueError, LookupError, TypeError):
            response_id = "<no id: the creating request failed>"
        return runner.http.request(self.method, self.path.format(id=response_id))


RETRIEVE = FollowUp(method="GET", path="/responses/{id}", after=STORED)
INPUT_ITEMS = FollowUp(method="GET", path="/responses/{id}/input_items", after=STORED)
DELETE = FollowUp(method="DELETE", path="/responses/{id}", after=STORED, previous=INPUT_ITEMS)
GONE = FollowUp(method="GET", path="/responses/{id}", after=STORED, previous=DELETE)


# Reading streams.


@dataclass
class EventStream:
    """A Responses stream split into its events (the JSON ``data`` of each)."""

    events: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """What is wrong with the framing itself."""

    def of_type(self, *kinds: str) -> list[dict[str, Any]]:
        return [event for event in self.events if event.get("type") in kinds]

    @property
    def final(self) -> dict[str, Any] | None:
        """The response the last event carries, if that event ends the stream."""
        last = self.events[-1] if self.events else {}
        response = last.get("response")
        return response if last.get("type") in TERMINAL and isinstance(response, dict) else None


def parse_event_stream(body: bytes) -> EventStream:
    """Split ``body`` into events as OpenAI frames them: ``event: <type>`` then
    ``data: <json>`` whose ``type`` is the same, a blank line after each; comments allowed."""
    stream = EventStream()
    problems = Problems()
    if b"\r" in body:
        problems.add("events use CR line endings; OpenAI separates them with \\n\\n")
        body = body.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    if body and not body.endswith(b"\n\n"):
        problems.add("the stream does not end with a blank line")
    for number, block in enumerate(filter(None, body.split(b"\n\n"))):
        lines = [line for line in block.split(b"\n") if line and not line.startswith(b":")]
        if not lines:
            continue  # keepalive comments
        if lines == [b"data: [DONE]"]:
            problems.add("data: [DONE] sent; a Responses stream ends with its final event")
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
        stream.events.append(event)
    stream.problems = problems.render()
    return stream


def event_stream(response: httpx.Response) -> tuple[EventStream | None, list[str]]:
    """A 200 Responses stream, parsed, or the problems that stop it being judged."""
    problems = status_code_problems(response)
    if problems:
        return None, problems
    kind = response.headers.get("content-type", "")
    if not kind.startswith("text/event-stream"):
        problems.append(f"Content-Type is {kind!r}")
    stream = parse_event_stream(response.content)
    return stream, problems + stream.problems


# What a response object must look like.


def _count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def usage_problems(usage: Any) -> list[str]:
    """A full usage object: input, output and total tokens that add up, and both details."""
    if not isinstance(usage, dict):
        return [f"usage is {short(usage)}, expected an object"]
    problems = [
        f"usage.{key} is {short(usage.get(key))}, expected a count"
        for key in ("input_tokens", "output_tokens", "total_tokens")
        if not _count(usage.get(key))
    ]
    if not problems and usage["total_tokens"] != usage["input_tokens"] + usage["output_tokens"]:
        problems.append(
            f"usage.total_tokens {usage['total_tokens']} is not input_tokens"
            f" {usage['input_tokens']} + output_tokens {usage['output_tokens']}"
        )
    for name, key in USAGE_DETAILS.items():
        details = usage.get(name)
        if not isinstance(details, dict) or not _count(details.get(key)):
            problems.append(f"usage.{name} is {short(details)}, expected {{{key}: <count>}}")
    return problems


def envelope_problems(body: dict[str, Any], model: str) -> list[str]:
    """``id``, ``object``, ``created_at``, ``status``, ``model`` echoed, the settings echoed."""
    problems = []
    if not isinstance(body.get("id"), str) or not body["id"].startswith("resp_"):
        problems.append(f"id is {short(body.get('id'))}, expected 'resp_...'")
    if body.get("object") != "response":
        problems.append(f"object is {short(body.get('object'))}, expected 'response'")
    if not isinstance(body.get("created_at"), int | float) or isinstance(body["created_at"], bool):
        problems.append(f"created_at is {short(body.get('created_at'))}, expected a number")
    if body.get("model") != model:
        problems.append(f"model is {short(body.get('model'))}, expected the requested {model!r}")
    missing = [key for key in ("error", "incomplete_details", *ECHOED) if key not in body]
    if missing:
        problems.append(f"no {', '.join(missing)} key(s)")
    if not isinstance(body.get("output"), list):
        problems.append(f"output is {short(body.get('output'))}, expected a list")
    return problems


def status_problems(body: dict[str, Any], expected: str) -> list[str]:
    """``status`` is ``expected``, with ``error`` and ``incomplete_details`` to match."""
    problems = []
    if body.get("status") != expected:
        problems.append(f"status is {short(body.get('status'))}, expected {expected!r}")
    if expected != "failed" and body.get("error", OMIT) is not None:
        problems.append(f"error is {short(body.get('error'))}, expected null")
    details = body.get("incomplete_details", OMIT)
    wanted = {"reason": "max_output_tokens"} if expected == "incomplete" else None
    if details != wanted:
        problems.append(f"incomplete_details is {short(details)}, expected {short(wanted)}")
    return problems


def message_problems(item: Any, where: str) -> list[str]:
    """An assistant ``message`` item: id, role, status, ``output_text`` parts with annotations."""
    if not isinstance(item, dict) or item.get("type") != "message":
        return [f"{where} is {short(item)}, expected a message item"]
    problems = []
    if not isinstance(item.get("id"), str) or not item["id"]:
        problems.append(f"{where}.id is {short(item.get('id'))}")
    if item.get("role") != "assistant":
        problems.append(f"{where}.role is {short(item.get('role'))}, expected 'assistant'")
    if item.get("status") not in ("completed", "incomplete"):
        problems.append(f"{where}.status is {short(item.get('status'))}")
    content = item.get("content")
    if not isinstance(content, list) or not content:
        return [*problems, f"{where}.content is {short(content)}, expected output_text parts"]
    for position, part in enumerate(content):
        at = f"{where}.content[{position}]"
        if not isinstance(part, dict) or part.get("type") != "output_text":
            problems.append(f"{at} is {short(part)}, expected an output_text part")
        elif not isinstance(part.get("text"), str) or part.get("annotations") != []:
            problems.append(
                f"{at} has text {short(part.get('text'))}, annotations"
                f" {short(part.get('annotations'))}; expected a string and []"
            )
    return problems


def function_call_problems(item: Any, where: str) -> list[str]:
    """A ``function_call`` item: id, ``call_id``, ``name``, JSON-object ``arguments``, status."""
    if not isinstance(item, dict) or item.get("type") != "function_call":
        return [f"{where} is {short(item)}, expected a function_call item"]
    problems = [
        f"{where}.{key} is {short(item.get(key))}, expected a string"
        for key in ("id", "call_id")
        if not isinstance(item.get(key), str) or not item[key]
    ]
    if item.get("name") != "get_weather":
        problems.append(f"{where}.name is {short(item.get('name'))}, expected 'get_weather'")
    if item.get("status") != "completed":
        problems.append(f"{where}.status is {short(item.get('status'))}, expected 'completed'")
    try:
        arguments = json.loads(item["arguments"])
    except (KeyError, TypeError, ValueError):
        arguments = None
    if not isinstance(arguments, dict):
        problems.append(f"{where}.arguments is {short(item.get('arguments'))}, not a JSON object")
    return problems


def output_items(body: dict[str, Any]) -> list[Any]:
    """The response's ``output``, or no items if it is not a list."""
    output = body.get("output")
    return output if isinstance(output, list) else []


def output_text(body: dict[str, Any]) -> str:
    """The text of every output_text part of the response, in order."""
    return "".join(
        part["text"]
        for item in output_items(body)
        if isinstance(item, dict) and isinstance(item.get("content"), list)
        for part in item["content"]
        if isinstance(part, dict) and isinstance(part.get("text"), str)
    )


def answer_problems(body: dict[str, Any], model: str) -> list[str]:
    """A text answer: the envelope, then message items only."""
    output = output_items(body)
    problems = envelope_problems(body, model)
    if body.get("status") not in ("completed", "incomplete"):
        problems.append(f"status is {short(body.get('status'))}, expected 'completed'")
    if not output:
        problems.append("output is empty, expected a message")
    for position, item in enumerate(output):
        problems += message_problems(item, f"output[{position}]")
    return problems


def incomplete_problems(body: dict[str, Any], model: str) -> list[str]:
    """``max_output_tokens`` reached: incomplete, its reason, that many output tokens."""
    problems = status_problems(body, "incomplete")
    usage = body.get("usage")
    tokens = usage.get("output_tokens") if isinstance(usage, dict) else None
    if tokens != MIN_OUTPUT_TOKENS:
        problems.append(f"usage.output_tokens is {short(tokens)}, expected {MIN_OUTPUT_TOKENS}")
    return problems


def called_problems(body: dict[str, Any], model: str) -> list[str]:
    """``tool_choice: required``: completed, a function_call item among the output."""
    output = output_items(body)
    calls = [item for item in output if isinstance(item, dict) and item.get("type") != "message"]
    if not calls:
        return [f"output has no function_call item: {short(output, 90)}"]
    problems = status_problems(body, "completed")
    for position, item in enumerate(output):
        if item in calls:
            problems += function_call_problems(item, f"output[{position}]")
    return problems


# What a stream must look like.


def sequence_problems(stream: EventStream, model: str) -> list[str]:
    """``sequence_number`` 0, 1, 2, ...: each break reported once, where it happens."""
    if not stream.events:
        return ["no events"]
    problems = []
    expected: Any = 0
    for number, event in enumerate(stream.events):
        found = event.get("sequence_number")
        if found != expected:
            problems.append(
                f"sequence_number is {short(found)} at event #{number}, expected {short(expected)}"
            )
        expected = found + 1 if _count(found) else number + 1
    return problems


def order_problems(stream: EventStream, model: str) -> list[str]:
    """created, in_progress, each output item opened and closed in OpenAI's order with
    its deltas adding up, then one final event; every event naming its item rightly."""
    kinds = [event.get("type") for event in stream.events]
    problems = []
    if kinds[:2] != ["response.created", "response.in_progress"]:
        problems.append(
            f"the stream opens with {short(kinds[:2])}, expected response.created,"
            " response.in_progress"
        )
    ends = [position for position, kind in enumerate(kinds) if kind in TERMINAL]
    if ends != [len(kinds) - 1]:
        problems.append(f"final events at {short(ends)} of {len(kinds)}: expected one, last")
    for position in (0, 1):
        response = stream.events[position].get("response") if position < len(kinds) else None
        if not isinstance(response, dict) or response.get("status") != "in_progress":
            problems.append(f"event #{position} carries no in_progress response")
    items = [event for event in stream.events if _count(event.get("output_index"))]
    indices = sorted({event["output_index"] for event in items})
    if indices != list(range(len(indices))):
        problems.append(f"output_index values are {short(indices)}, expected 0, 1, ...")
    for index in indices:
        problems += _item_problems([event for event in items if event["output_index"] == index])
    return problems


# The events of one output item in order, a run of deltas as one: a message's, a call's.
MESSAGE_EVENTS = (
    "response.output_item.added", "response.content_part.added", "response.output_text.delta",
    "response.output_text.done", "response.content_part.done", "response.output_item.done",
)  # fmt: skip
CALL_EVENTS = (
    "response.output_item.added", "response.function_call_arguments.delta",
    "response.function_call_arguments.done", "response.output_item.done",
)  # fmt: skip


def _item_problems(events: list[dict[str, Any]]) -> list[str]:
    """The events of one output item (those with its ``output_index``), in stream order."""
    index = events[0].get("output_index")
    first = events[0].get("item")
    item = first if isinstance(first, dict) else {}
    label = f"output item {index}"
    is_call = item.get("type") == "function_call"
    expected = CALL_EVENTS if is_call else MESSAGE_EVENTS
    delta = expected[1] if is_call else expected[2]
    runs = [kind for kind, _ in groupby(event.get("type") for event in events)]
    if runs not in (list(expected), [kind for kind in expected if kind != delta]):
        return [f"{label}'s events are {short(runs, 200)}, expected {short(expected, 200)}"]
    problems = []
    wrong = [
        e.get("type") for e in events[1:] if e.get("item_id", item.get("id")) != item.get("id")
    ]
    if wrong:
        problems.append(f"{label}: {', '.join(map(str, wrong))} name another item_id")
    text = "".join(str(event.get("delta")) for event in events if event.get("type") == delta)
    done = events[-1].get("item")
    done = done if isinstance(done, dict) else {}
    if is_call:
        finals = [events[-2].get("arguments"), done.get("arguments")]
    else:
        part = events[-2].get("part")
        finals = [events[-3].get("text"), part.get("text") if isinstance(part, dict) else None]
        finals.append(output_text({"output": [done]}))
    if any(final != text for final in finals):
        problems.append(
            f"{label}'s deltas add up to {short(text)}, its done events say {short(finals)}"
        )
    return problems + (
        function_call_problems(done, f"{label} done")
        if is_call
        else message_problems(done, f"{label} done")
    )


def shape(value: Any) -> Any:
    """``value`` with every leaf replaced by its JSON type: what two responses to the same
    request must share."""
    if isinstance(value, dict):
        return {key: shape(member) for key, member in sorted(value.items())}
    if isinstance(value, list):
        return [shape(member) for member in value]
    return "null" if value is None else type(value).__name__


def parity_problems(model: str, responses: Sequence[httpx.Response]) -> list[str]:
    """The stream's final response and the non-stream object (temperature 0): same shape,
    text, status and output tokens."""
    body, problems = json_body(responses[0])
    stream, stream_problems = event_stream(responses[1])
    if body is None or stream is None:
        return problems + stream_problems
    final = stream.final
    if final is None:
        return ["the stream carries no final response"]
    if shape(final) != shape(body):
        keys = sorted(set(body) ^ set(final))
        problems.append(
            "the final event's response is not shaped like the non-stream object"
            + (f": keys {', '.join(keys)} differ" if keys else "")
        )
    if output_text(final) != output_text(body):
        problems.append(
            f"text differs: {short(output_text(body), 40)} vs streamed"
            f" {short(output_text(final), 40)}"
        )
    for key, value in (("status", body.get("status")), ("usage", body.get("usage"))):
        streamed = final.get(key)
        if key == "usage" and isinstance(value, dict) and isinstance(streamed, dict):
            value, streamed = value.get("output_tokens"), streamed.get("output_tokens")
        if value != streamed:
            problems.append(f"{key} {short(value)} vs streamed {short(streamed)}")
    return problems


# Stored responses.


def lifecycle_problems(model: str, responses: Sequence[httpx.Response]) -> list[str]:
    """Created with ``store``; retrieved as created; deleted; then a 404."""
    created, problems = json_body(responses[0])
    if created is None:
        return [f"create: {problem}" for problem in problems]
    retrieved, retrieve_problems = json_body(responses[1])
    problems += [f"retrieve: {problem}" for problem in retrieve_problems]
    if retrieved is not None and retrieved != created:
        keys = sorted(
            key for key in {*created, *retrieved} if created.get(key) != retrieved.get(key)
        )
        problems.append(f"retrieve: differs from the created response in {', '.join(keys)}")
    deleted, delete_problems = json_body(responses[2])
    problems += [f"delete: {problem}" for problem in delete_problems]
    expected = {"id": created.get("id"), "object": "response", "deleted": True}
    if deleted is not None and deleted != expected:
        problems.append(f"delete: body is {short(deleted, 90)}, expected {short(expected, 90)}")
    gone = judge_error(404, type=INVALID)(model, responses[3:])
    return problems + [f"after delete: {problem}" for problem in gone]


def input_items_problems(model: str, responses: Sequence[httpx.Response]) -> list[str]:
    """The input of a stored response: a list with ids, ``first_id``, ``last_id``, ``has_more``."""
    page, data, problems = listed(responses[1], "the input message")
    if data is None:
        return problems
    ids = [item.get("id") if isinstance(item, dict) else None for item in data]
    if not all(isinstance(item_id, str) and item_id for item_id in ids):
        problems.append(f"item ids are {short(ids)}, expected strings")
    if (page.get("first_id"), page.get("last_id")) != (ids[0], ids[-1]):
        problems.append(
            f"first_id, last_id are {short([page.get('first_id'), page.get('last_id')])},"
            f" expected {short([ids[0], ids[-1]])}"
        )
    if page.get("has_more") is not False:
        problems.append(f"has_more is {short(page.get('has_more'))}, expected false")
    message = data[-1] if isinstance(data[-1], dict) else {}
    content = message.get("content")
    part = content[0] if isinstance(content, list) and content else {}
    if (message.get("type"), message.get("role"), part) != (
        "message", "user", {"type": "input_text", "text": HELLO_PROMPT}
    ):  # fmt: skip
        problems.append(f"the input message is {short(message, 120)}")
    return problems


# Judges.


def judge_events(*inspect: Callable[[EventStream, str], list[str]]) -> Judge:
    """Judge one Responses stream with ``inspect``; framing problems are ``framing``'s."""

    return judge_parsed(event_stream, *inspect)


def framing_problems(model: str, responses: Sequence[httpx.Response]) -> list[str]:
    return event_stream(responses[0])[1]


def _final(expected: str) -> Callable[[EventStream, str], list[str]]:
    def inspect(stream: EventStream, model: str) -> list[str]:
        last = stream.events[-1].get("type") if stream.events else None
        problems = [] if last == expected else [f"the last event is {short(last)}, not {expected}"]
        final = stream.final
        status = expected.removeprefix("response.")
        return problems + ([] if final is None else status_problems(final, status))

    return inspect


def _final_response(*inspect: Callable[[dict[str, Any], str], list[str]]) -> Judge:
    """Judge the response a stream's final event carries with ``inspect``."""

    def check(stream: EventStream, model: str) -> list[str]:
        final = stream.final
        if final is None:
            return ["the stream carries no final response"]
        return [problem for each in inspect for problem in each(final, model)]

    return judge_events(check)


CHECKS: tuple[Check, ...] = (
    Check(
        "responses.object",
        "id resp_..., object response, created_at, model echoed, settings echoed, messages",
        (RESPONSE,),
        judge_json(answer_problems),
    ),
    Check(
        "responses.usage",
        "input/output/total tokens add up, with cached_tokens and reasoning_tokens",
        (RESPONSE,),
        judge_json(lambda body, model: usage_problems(body.get("usage"))),
    ),
    Check(
        "responses.stream.framing",
        "text/event-stream; event: lines naming each data's type; no [DONE]",
        (RESPONSE_STREAM,),
        framing_problems,
    ),
    Check(
        "responses.stream.sequence",
        "sequence_number 0, 1, 2, ... without gaps",
        (RESPONSE_STREAM,),
        judge_events(sequence_problems),
    ),
    Check(
        "responses.stream.order",
        "created, in_progress, item added ... deltas ... done, one final event last",
        (RESPONSE_STREAM,),
        judge_events(order_problems, _final("response.completed")),
    ),
    Check(
        "responses.stream.usage",
        "the final event's response carries the full usage",
        (RESPONSE_STREAM,),
        _final_response(lambda body, model: usage_problems(body.get("usage"))),
    ),
    Check(
        "responses.parity",
        "the stream's final response is the non-stream object: shape, text, status, usage",
        (RESPONSE, RESPONSE_STREAM),
        parity_problems,
    ),
    Check(
        "responses.incomplete",
        f"max_output_tokens {MIN_OUTPUT_TOKENS}: incomplete, reason max_output_tokens",
        (_responses(INCOMPLETE),),
        judge_json(incomplete_problems),
    ),
    Check(
        "responses.incomplete.stream",
        f"max_output_tokens {MIN_OUTPUT_TOKENS}: response.incomplete last",
        (_responses(INCOMPLETE, stream=True),),
        judge_events(_final("response.incomplete"), order_problems),
    ),
    Check(
        "responses.function-call",
        "tool_choice required: a function_call item with call_id, name, JSON arguments",
        (_responses(FUNCTION_CALL),),
        judge_json(called_problems),
    ),
    Check(
        "responses.function-call.stream",
        "tool_choice required: item added, arguments deltas, arguments done, item done",
        (_responses(FUNCTION_CALL, stream=True),),
        judge_events(order_problems, _final("response.completed")),
    ),
    Check(
        "responses.store.lifecycle",
        "store: retrieve gives the response, delete says deleted, then 404",
        (STORED, RETRIEVE, DELETE, GONE),
        lifecycle_problems,
    ),
    Check(
        "responses.store.input-items",
        "input_items: a list of the input with ids, first_id, last_id, has_more",
        (STORED, INPUT_ITEMS),
        input_items_problems,
    ),
    Check(
        "responses.error.temperature",
        "temperature 3: 400, param temperature",
        (_responses({**ANSWER, "temperature": 3}),),
        judge_error(400, type=INVALID, param="temperature"),
    ),
    Check(
        "responses.error.unknown-parameter",
        "an unknown parameter: 400 unknown_parameter naming it",
        (_responses({**ANSWER, UNKNOWN_ARGUMENT: True}),),
        judge_error(400, type=INVALID, param=UNKNOWN_ARGUMENT, code="unknown_parameter"),
    ),
    Check(
        "responses.error.stream-status",
        "stream: true with a bad request: a real 400, not a 200 stream",
        (_responses({**ANSWER, "temperature": 3}, stream=True),),
        judge_error(400, type=INVALID, param="temperature"),
    ),
    Check(
        "responses.error.key",
        "a bad key: 401 invalid_api_key",
        (_responses(ANSWER, bad_key=True),),
        judge_error(401, type=INVALID, code="invalid_api_key"),
    ),
)
"""The Responses API's rows of the conformance table."""

__all__ = ["CHECKS", "EventStream", "FollowUp", "ResponsesProbe", "parse_event_stream"]
