"""Calling an upstream that speaks Anthropic's Messages API natively (``wire_api: messages``).

:func:`upstream_request` writes a chat request (whichever endpoint it came
from) as a ``POST /messages`` body, and :class:`MessagesEventReader` reads the
named events (or the whole message) the upstream answers back into normalized
backend events. The reader is a :class:`~chatparity.protocol.upstream.ChunkReader`:
each event is read as the chat delta it stands for, so every repair and every
distrust of the chat path applies (ids, finishers, usage not believed, errors
not passed on); thinking is read as reasoning.

Thinking is asked for only when the request has a ``reasoning_effort`` (an
alias's default, or a chat client's) and Anthropic's rules allow it: no forced
tool, ``temperature`` 1 or unset, ``top_p`` unset or at least 0.95, a budget of
at least :data:`~chatparity.protocol.messages.MIN_THINKING_BUDGET` below
``max_tokens``, and not inside a run of tool calls (Anthropic wants the
thinking of such a turn back, which chat messages do not keep).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, TypeGuard

import orjson

from .breakpoints import cache_marked
from .events import Event, Finish
from .ids import call_id_of, tool_use_id
from .messages import MIN_THINKING_BUDGET
from .messages_stream import tool_input
from .request import ChatRequest, Message, TextPart, Tool
from .upstream import ChunkReader, ServerSentEvent, believed_usage, malformed, well_shaped

ANTHROPIC_VERSION = "2023-06-01"
"""The ``anthropic-version`` header an upstream is called with."""
DEFAULT_MAX_TOKENS = 4096
"""``max_tokens`` for a request that sets none (Anthropic requires one; every Claude
model allows this many)."""
THINKING_BUDGETS = {"minimal": 1024, "low": 2048, "medium": 8192, "high": 16384}
"""The thinking budget a ``reasoning_effort`` asks for (``none``: no thinking)."""

# Why an upstream's message stopped -> the finish reason it stands for.
_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content_filter",
}


def upstream_request(
    request: ChatRequest, model: str, forwarded: dict[str, Any], *, cache_ttl: bool = True
) -> dict[str, Any]:
    """The ``/messages`` body asking ``model`` what ``request`` asks, streamed.
    ``forwarded``: the chat parameters the backend passes on (its sampling and format
    ones, and those the alias forwards), read from here.

    A request with cache markers is written block for block as it came (its parts,
    calls, results and tools each with its marker: the cached prefix is the one the
    client marked); ``cache_ttl`` false sends each marker without its ``ttl``, for
    upstreams that refuse it."""
    mark = _Marker(cache_ttl) if cache_marked(request) else None
    body: dict[str, Any] = {
        "model": model or request.model,
        "max_tokens": request.most_completion_tokens or DEFAULT_MAX_TOKENS,
        "messages": _ending_clean(list(_turns(request.messages, mark))),
        "stream": True,
    }
    instructions = [m for m in request.messages if m.role in ("system", "developer")]
    if mark is not None:
        blocks = [block for message in instructions for block in _text_blocks(message, mark)]
        if blocks:
            body["system"] = blocks
        if request.cache_control is not None:
            body["cache_control"] = mark(request.cache_control)
    elif system := [m.content for m in instructions if _has_text(m.content)]:
        body["system"] = "\n\n".join(system)
    if "temperature" in forwarded:
        body["temperature"] = min(forwarded["temperature"], 1.0)  # Anthropic's most
    if "top_p" in forwarded:
        body["top_p"] = forwarded["top_p"]
    # Anthropic refuses a stop sequence of whitespace alone: such ones are not sent.
    stops = [stop for stop in request.stop or () if not stop.isspace()]
    if stops and "stop" in forwarded:
        body["stop_sequences"] = stops
    if request.user is not None and "user" in forwarded:
        body["metadata"] = {"user_id": request.user}
    if "service_tier" in forwarded:
        body["service_tier"] = "auto" if forwarded["service_tier"] == "auto" else "standard_only"
    if request.tools and not forwarded.keys().isdisjoint(("tools", "functions")):
        body["tools"] = [_tool(tool, mark) for tool in request.tools]
        body["tool_choice"] = _tool_choice(request)
    spec = request.response_format
    if spec is not None and spec.type == "json_schema" and "response_format" in forwarded:
        body["output_config"] = {"format": {"type": "json_schema", "schema": spec.schema}}
    if "reasoning_effort" in forwarded:
        thinking = _thinking(request, body)
        if thinking is not None:
            body["thinking"] = thinking
    return body


class _Marker:
    """Writes a cache marker onto a block, with its ``ttl`` or (``ttl`` false) without."""

    def __init__(self, ttl: bool) -> None:
        self.ttl = ttl

    def __call__(self, marker: dict[str, Any]) -> dict[str, Any]:
        return marker if self.ttl else {"type": marker["type"]}

    def on(self, block: dict[str, Any], marker: dict[str, Any] | None) -> dict[str, Any]:
        """``block``, with ``marker`` if there is one."""
        if marker is not None:
            block["cache_control"] = self(marker)
        return block


def _tool(tool: Tool, mark: _Marker | None) -> dict[str, Any]:
    parameters = tool.parameters
    schema = parameters if parameters and parameters.get("type") == "object" else None
    written: dict[str, Any] = {
        "name": tool.name,
        "input_schema": schema or {"type": "object", "properties": {}},
    }
    if tool.description is not None:
        written["description"] = tool.description
    if tool.strict:
        written["strict"] = True
    return mark.on(written, tool.cache_control) if mark is not None else written


def _tool_choice(request: ChatRequest) -> dict[str, Any]:
    choice = request.tool_choice
    if choice.mode == "none":
        return {"type": "none"}
    if choice.mode == "function":
        anthropic: dict[str, Any] = {"type": "tool", "name": choice.name}
    else:
        anthropic = {"type": "any" if choice.mode == "required" else "auto"}
    if not request.parallel_tool_calls:
        anthropic["disable_parallel_tool_use"] = True
    return anthropic


def _thinking(request: ChatRequest, body: dict[str, Any]) -> dict[str, Any] | None:
    """The ``thinking`` the request's effort asks for, where Anthropic's rules allow it."""
    budget = THINKING_BUDGETS.get(request.reasoning_effort or "none")
    if budget is None or body.get("tool_choice", {}).get("type") in ("any", "tool"):
        return None
    if body.get("temperature", 1.0) != 1.0 or body.get("top_p", 1.0) < 0.95:
        return None
    budget = min(budget, body["max_tokens"] - 1)
    last = body["messages"][-1] if body["messages"] else None
    calling = last is not None and any(block["type"] == "tool_result" for block in last["content"])
    if budget < MIN_THINKING_BUDGET or calling:
        return None
    return {"type": "enabled", "budget_tokens": budget}


def _has_text(content: str | None) -> TypeGuard[str]:
    """Whether ``content`` is more than whitespace: Anthropic refuses a text block that is
    not (``text content blocks must contain non-whitespace text``), and models answer
    ``"\\n\\n"`` before their calls."""
    return bool(content and not content.isspace())


def _text_blocks(message: Message, mark: _Marker) -> list[dict[str, Any]]:
    """A message's text parts as text blocks, each with its marker (text of whitespace
    alone is no block)."""
    parts = message.parts or (TextPart(message.content or ""),)
    return [
        mark.on({"type": "text", "text": part.text}, part.cache_control)
        for part in parts
        if _has_text(part.text)
    ]


def _blocks(message: Message, mark: _Marker | None) -> list[dict[str, Any]]:
    """One chat message's content blocks (text of whitespace alone is no block), with
    their markers when ``mark`` writes them: a tool result's is its parts' (Anthropic
    takes none inside a result)."""
    if message.role == "tool":
        result = {"type": "tool_result", "tool_use_id": tool_use_id(message.tool_call_id or "")}
        result["content"] = message.content or ""
        if mark is not None:
            markers = [part.cache_control for part in message.parts if part.cache_control]
            mark.on(result, markers[-1] if markers else None)
        return [result]
    blocks: list[dict[str, Any]] = []
    if mark is not None:
        blocks += _text_blocks(message, mark)
    elif _has_text(message.content):
        blocks.append({"type": "text", "text": message.content})
    for call in message.tool_calls or ():
        function = call["function"]
        use = {
            "type": "tool_use",
            "id": tool_use_id(call["id"]),
            "name": function["name"],
            "input": tool_input(function["arguments"]),
        }
        blocks.append(mark.on(use, call.get("cache_control")) if mark is not None else use)
    return blocks


def _turns(messages: list[Message], mark: _Marker | None) -> Iterator[dict[str, Any]]:
    """The conversation as Anthropic's turns: system messages left for ``system``, tool
    results and deprecated function results in user turns, consecutive turns of one
    role merged, empty ones left out."""
    turn: dict[str, Any] | None = None
    for message in messages:
        if message.role in ("system", "developer"):
            continue
        role = "assistant" if message.role == "assistant" else "user"
        blocks = _blocks(message, mark)
        if not blocks:
            continue
        if turn is not None and turn["role"] == role:
            turn["content"] += blocks
            continue
        if turn is not None:
            yield turn
        turn = {"role": role, "content": blocks}
    if turn is not None:
        yield turn


def _ending_clean(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``turns`` with the text that ends an assistant turn last (a prefill) stripped of
    trailing whitespace, which Anthropic refuses (``final assistant content cannot end
    with trailing whitespace``)."""
    if turns and turns[-1]["role"] == "assistant":
        last = turns[-1]["content"][-1]
        if last["type"] == "text":
            last["text"] = last["text"].rstrip()
    return turns


class MessagesEventReader(ChunkReader):
    """Normalized events from one upstream message (one choice: ``n`` is 1), read from
    its named stream events or its whole message object."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._slots: dict[int, int] = {}  # a tool use's block index -> its call index
        self._usage: dict[str, Any] = {}  # the upstream's usage so far, in its names
        self._stop_sequence: str | None = None
        self._whole = False  # reading a whole message: its parts count by their length

    def read(self, sse: ServerSentEvent) -> list[Event]:
        if sse.data.strip() == "[DONE]":
            self.done = True
            return []
        # An error event is an error envelope; a message_delta's usage, in Anthropic's
        # names, is read by _end (ChunkReader's reading of it is replaced there).
        event = self._payload(sse.data, "an event", error_event=sse.event == "error")
        with well_shaped(sse.data):
            return self._event(event)

    def read_completion(self, body: bytes) -> list[Event]:
        """The events of a whole message object (an upstream that did not stream)."""
        self.done = self._whole = True
        message = self._payload(body, "the message")
        with well_shaped(body):
            events = [
                event
                for index, block in enumerate(message.get("content") or ())
                for event in self._start(index, block)
            ]
            self._note_usage(message.get("usage"))
            return events + self._end(message)

    def body_ended(self) -> None:
        """A message's stream says why it stopped (``message_delta``) before it ends: one
        that ended before is cut short (the upstream's connection dropped), never taken
        for a whole answer."""
        if not self._finished:
            raise malformed("the stream ended before the message did")

    def _event(self, event: dict[str, Any]) -> list[Event]:
        kind = event.get("type")
        if kind == "content_block_delta":
            return self._delta(event["index"], event["delta"])
        if kind == "content_block_start":
            return self._start(event["index"], event["content_block"])
        if kind == "message_start":
            self._note_usage(event["message"].get("usage"))
            return []
        if kind == "message_delta":
            self._note_usage(event.get("usage"))
            return self._end(event["delta"])
        if kind == "message_stop":
            self.done = True
        return []  # content_block_stop, ping, and what newer APIs add

    def _start(self, index: int, block: dict[str, Any]) -> list[Event]:
        kind = block.get("type")
        if kind == "text":
            return self._text(block.get("text") or "")
        if kind == "thinking":
            return self._thinking(block.get("thinking") or "")
        if kind != "tool_use":
            return []  # redacted thinking, server tools' blocks: nothing to pass on
        if index in self._slots:
            return []
        slot = self._slots[index] = len(self._slots)
        use_id = block.get("id")  # Anthropic's toolu_ id: a call id of OpenAI's form inside
        call_id = call_id_of(use_id) if isinstance(use_id, str) and use_id else None
        call = {"index": slot, "id": call_id, "function": {"name": block.get("name")}}
        events = self._choice({"index": 0, "delta": {"tool_calls": [call]}})
        given = block.get("input")
        if isinstance(given, dict) and given:  # a whole message's, or a stream's given at once
            events += self._arguments(index, orjson.dumps(given).decode())
        return events

    def _delta(self, index: int, delta: dict[str, Any]) -> list[Event]:
        kind = delta.get("type")
        if kind == "text_delta":
            return self._text(delta["text"])
        if kind == "input_json_delta":
            return self._arguments(index, delta["partial_json"])
        if kind == "thinking_delta":
            return self._thinking(delta["thinking"])
        return []  # signatures, citations

    def _text(self, text: str) -> list[Event]:
        if not isinstance(text, str):
            raise TypeError("text is not a string")
        if not text:
            return []
        return self._choice({"index": 0, "delta": {"content": text}}, whole=self._whole)

    def _thinking(self, text: str) -> list[Event]:
        if not isinstance(text, str):
            raise TypeError("thinking is not a string")
        if not text:
            return []
        return self._choice({"index": 0, "delta": {"reasoning_content": text}}, whole=self._whole)

    def _arguments(self, index: int, arguments: str) -> list[Event]:
        if not isinstance(arguments, str):
            raise TypeError("arguments are not a string")
        if not arguments or index not in self._slots:
            return []
        call = {"index": self._slots[index], "function": {"arguments": arguments}}
        return self._choice({"index": 0, "delta": {"tool_calls": [call]}}, whole=self._whole)

    def _end(self, delta: dict[str, Any]) -> list[Event]:
        reason = _FINISH.get(str(delta.get("stop_reason")), "stop")
        sequence = delta.get("stop_sequence")
        self._stop_sequence = sequence if isinstance(sequence, str) else None
        return [
            dataclasses.replace(event, stop_sequence=self._stop_sequence)
            if isinstance(event, Finish) and event.reason == "stop"
            else event
            for event in self._choice({"index": 0, "delta": {}, "finish_reason": reason})
        ]

    def _note_usage(self, usage: Any) -> None:
        """Take the counts of ``usage`` (a message's, or a delta's cumulative ones) and
        believe the whole so far if it can be. ``input_tokens`` leaves out the tokens
        read from the cache (``cache_read_input_tokens``) and written to it
        (``cache_creation_input_tokens``, split by lifetime in ``cache_creation``: what
        it does not say is 1h is 5m, Anthropic's default)."""
        if not isinstance(usage, dict):
            return
        self._usage.update((key, value) for key, value in usage.items() if value is not None)
        seen = self._usage
        details = seen.get("output_tokens_details")
        thinking = details.get("thinking_tokens") if isinstance(details, dict) else 0
        read = seen.get("cache_read_input_tokens", 0)
        written = seen.get("cache_creation_input_tokens", 0)
        lifetimes = seen.get("cache_creation")
        written_1h = (
            lifetimes.get("ephemeral_1h_input_tokens", 0) if isinstance(lifetimes, dict) else 0
        )
        self.upstream_usage = believed_usage(
            _total(seen.get("input_tokens"), written, read),
            seen.get("output_tokens"),
            self.most_completion_tokens,
            cached=read,
            reasoning=thinking,
            write_5m=written - written_1h if _total(written, written_1h) is not None else None,
            write_1h=written_1h,
        )
        self.refused_usage = None if self.upstream_usage else usage


def _total(*counts: Any) -> Any:
    """The counts added up when each is a JSON integer, else None (which is not believed)."""
    if all(isinstance(count, int) and not isinstance(count, bool) for count in counts):
        return sum(counts)
    return None
