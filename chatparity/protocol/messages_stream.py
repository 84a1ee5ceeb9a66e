"""Backend events -> Anthropic's Messages stream events and its ``message`` object.

:class:`MessageEncoder` is the Messages encoding of the same event stream
:class:`~chatparity.protocol.stream.ChunkEncoder` encodes as chat chunks:
``message_start``, then for each content block (thinking, text, a tool use)
``content_block_start``, its deltas (``thinking_delta``, ``text_delta``,
``input_json_delta``) and ``content_block_stop``, then ``message_delta`` (the
stop reason and the cumulative usage) and ``message_stop``. A block ends when
the next begins, or the choice finishes. A tool use's input is sent whole, as
one ``input_json_delta`` when its block ends: a backend's arguments may not be
a JSON object (cut short, or not JSON at all), and a client joins the deltas
into the object Anthropic promises; calls a backend streams side by side are
sent one after the other. The non-stream object is
:meth:`MessageEncoder.message` once every event was encoded: the very blocks
the stream carried, so the two cannot disagree.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import orjson

from . import ids
from .errors import APIError
from .events import Event, Finish, ReasoningDelta, TextDelta, ToolCallDelta, Usage
from .messages import StopReason, error_body

EventType = Literal[
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
    "ping",
    "error",
]
EVENT_TYPES: tuple[EventType, ...] = get_args(EventType)
"""The events a message streams, in the order they first come (a ``ping`` may come at
any time, an ``error`` ends a stream that failed)."""

# Why a choice ended -> why its message stopped (a choice that called tools: tool_use).
_STOP_REASONS: dict[str, StopReason] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}

_HEADS: dict[str, bytes] = {kind: f"event: {kind}\ndata: ".encode() for kind in EVENT_TYPES}

PING = b'event: ping\ndata: {"type":"ping"}\n\n'
"""Sent while a slow backend has not begun (Anthropic's keepalive; clients skip it)."""


def sse_event(event: dict[str, Any]) -> bytes:
    """One server-sent event with its ``event:`` line, as Anthropic sends them."""
    kind: str = event["type"]
    head = _HEADS.get(kind) or f"event: {kind}\ndata: ".encode()
    return head + orjson.dumps(event) + b"\n\n"


def usage_object(usage: Usage) -> dict[str, Any]:
    """``usage`` in Anthropic's names: its ``input_tokens`` leave out those read from the
    prompt cache and written to it, counted apart (the writes by lifetime in
    ``cache_creation``, when there are some)."""
    written = usage.cache_write_tokens
    counts: dict[str, Any] = {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens - written,
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": usage.cached_tokens,
    }
    if written:
        counts["cache_creation"] = {
            "ephemeral_5m_input_tokens": usage.cache_write_5m_tokens,
            "ephemeral_1h_input_tokens": usage.cache_write_1h_tokens,
        }
    counts["output_tokens"] = usage.completion_tokens
    return counts


@dataclass
class _Block:
    """A content block being streamed: thinking, text, or a tool use and its input."""

    index: int
    kind: Literal["thinking", "text", "tool_use"]
    id: str = ""
    name: str = ""
    fragments: list[str] = field(default_factory=list)

    def start(self) -> dict[str, Any]:
        """The block as ``content_block_start`` announces it: empty."""
        if self.kind == "text":
            return {"type": "text", "text": ""}
        if self.kind == "thinking":
            return {"type": "thinking", "thinking": "", "signature": ""}
        return {"type": "tool_use", "id": self.id, "name": self.name, "input": {}}

    def start_event(self) -> dict[str, Any]:
        return {"type": "content_block_start", "index": self.index, "content_block": self.start()}

    def value(self) -> dict[str, Any]:
        """The block as the message holds it."""
        text = "".join(self.fragments)
        if self.kind == "text":
            return {"type": "text", "text": text}
        if self.kind == "thinking":
            return {"type": "thinking", "thinking": text, "signature": ""}
        return {"type": "tool_use", "id": self.id, "name": self.name, "input": tool_input(text)}


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as a tool use's ``input``: an object (none: ``{}``, and so is
    anything that is not a JSON object, which a tool could not take)."""
    try:
        value = orjson.loads(arguments) if arguments else {}
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


class MessageEncoder:
    """Turns one request's backend events into Anthropic's Messages stream events.

    :meth:`opening` gives ``message_start`` (with ``input_tokens`` as estimated:
    the backend's count comes with its usage, in ``message_delta``),
    :meth:`encode` the events of each backend event (choice 0: a message has
    one), :meth:`closing` the end and :meth:`failing` a failure after the first
    byte (an ``error`` event). Not ``streaming``, it makes no event of each
    delta: only the message is sent. While a tool use's input is held, a ``ping``
    goes out every ``ping_every`` seconds that its fragments keep coming: a long
    input (a file written whole) is no silence a client or a proxy gives up on.
    """

    def __init__(
        self,
        *,
        message_id: str,
        model: str,
        input_tokens: int,
        request_id: str,
        streaming: bool = True,
        ping_every: float = 15.0,
    ) -> None:
        self._base = {"id": message_id, "type": "message", "role": "assistant", "model": model}
        self._input_tokens = input_tokens
        self._request_id = request_id
        self._streaming = streaming
        self._blocks: list[_Block] = []
        self._current: _Block | None = None
        self._calls: dict[int, _Block] = {}
        self._waiting: list[_Block] = []  # calls begun while another's block is open
        self._ping_every = ping_every
        self._ping_at = time.monotonic() + ping_every  # while an input is held
        self._reason: str | None = None
        self._stop_sequence: str | None = None
        self._usage: Usage | None = None
        self._output_tokens = 0  # counted from the deltas until the backend's usage

    def message(self) -> dict[str, Any]:
        """The message object as it stands (once closed: the whole message)."""
        return {
            **self._base,
            "content": [block.value() for block in self._blocks],
            "stop_reason": self._stop_reason(),
            "stop_sequence": self._stop_sequence,
            "stop_details": None,
            "usage": self._usage_object(),
        }

    def opening(self, announced: Usage | None = None) -> list[dict[str, Any]]:
        """``message_start``, with the usage the upstream ``announced`` (a Messages
        upstream's own ``message_start``: its cache's reads and writes), else the
        estimated input."""
        estimate = announced or Usage(self._input_tokens, 0)
        started: dict[str, Any] = {
            **self._base,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "stop_details": None,
            "usage": {**usage_object(estimate), "service_tier": "standard"},
        }
        return [{"type": "message_start", "message": started}]

    def encode(self, event: Event) -> list[dict[str, Any]]:
        if isinstance(event, TextDelta):  # most events: checked first
            return self._delta("text", event.text, event.tokens) if event.index == 0 else []
        if isinstance(event, Usage):
            self._usage = event
            return []
        if event.index != 0:
            return []  # an alias's default n above 1: a message has one choice
        if isinstance(event, ReasoningDelta):
            return self._delta("thinking", event.text, event.tokens)
        if isinstance(event, ToolCallDelta):
            return self._call(event)
        return self._finish(event)

    def closing(self) -> list[dict[str, Any]]:
        """The events that end a message whose backend sent everything."""
        events = self._close_current()
        if self._reason is None:  # no finisher came: the backend said all it had
            self._reason = "stop"
        usage = self._usage_object()
        del usage["service_tier"]
        delta = {"stop_reason": self._stop_reason(), "stop_sequence": self._stop_sequence}
        return [
            *events,
            {"type": "message_delta", "delta": delta, "usage": usage},
            {"type": "message_stop"},
        ]

    def failing(self, error: APIError) -> list[dict[str, Any]]:
        """The event that ends a message whose backend failed after the first byte."""
        return [error_body(error, self._request_id)]

    def _stop_reason(self) -> StopReason | None:
        if self._reason is None:
            return None
        if any(block.kind == "tool_use" for block in self._blocks):
            return "tool_use" if self._reason != "length" else "max_tokens"
        if self._stop_sequence is not None:
            return "stop_sequence"
        return _STOP_REASONS.get(self._reason, "end_turn")

    def _usage_object(self) -> dict[str, Any]:
        usage = self._usage or Usage(self._input_tokens, self._output_tokens, counted=True)
        return {**usage_object(usage), "service_tier": "standard"}

    def _open(self, block: _Block) -> list[dict[str, Any]]:
        events = self._close_current()
        self._blocks.append(block)
        self._current = block
        if not self._streaming:
            return events
        return [*events, block.start_event()]

    def _delta(
        self, kind: Literal["thinking", "text"], text: str, tokens: int
    ) -> list[dict[str, Any]]:
        self._output_tokens += tokens
        events: list[dict[str, Any]] = []
        block = self._current
        if block is None or block.kind != kind:
            block = _Block(len(self._blocks), kind)
            events = self._open(block)
        block.fragments.append(text)
        if not self._streaming or not text:
            return events
        delta = (
            {"type": "text_delta", "text": text}
            if kind == "text"
            else {"type": "thinking_delta", "thinking": text}
        )
        events.append({"type": "content_block_delta", "index": block.index, "delta": delta})
        return events

    def _call(self, delta: ToolCallDelta) -> list[dict[str, Any]]:
        self._output_tokens += delta.tokens
        events: list[dict[str, Any]] = []
        block = self._calls.get(delta.call_index)
        if block is None:
            call = delta.id or ids.call_id()
            block = _Block(
                len(self._blocks), "tool_use", id=ids.tool_use_id(call), name=delta.name or ""
            )
            self._calls[delta.call_index] = block
            current = self._current
            if current is not None and current.kind == "tool_use":
                self._blocks.append(block)  # sent once the open call's block ends
                self._waiting.append(block)
            else:
                events = self._open(block)
        if block is self._current or block in self._waiting:
            # Else its input was sent (text came between): what the stream said stands.
            block.fragments.append(delta.arguments)
        if events or not self._streaming:
            return events
        now = time.monotonic()
        if now < self._ping_at:
            return events
        self._ping_at = now + self._ping_every
        return [{"type": "ping"}]

    def _finish(self, finish: Finish) -> list[dict[str, Any]]:
        self._reason = finish.reason
        self._stop_sequence = finish.stop_sequence if finish.reason == "stop" else None
        return self._close_current()

    def _close_current(self) -> list[dict[str, Any]]:
        block, self._current = self._current, None
        waiting, self._waiting = self._waiting, []
        if block is None or not self._streaming:
            return []
        if block.kind != "tool_use":
            return [{"type": "content_block_stop", "index": block.index}]
        events: list[dict[str, Any]] = []
        for call in (block, *waiting):
            if call is not block:
                events.append(call.start_event())
            given = call.value()["input"]
            if given:
                json_delta = {
                    "type": "input_json_delta",
                    "partial_json": orjson.dumps(given).decode(),
                }
                events.append(
                    {"type": "content_block_delta", "index": call.index, "delta": json_delta}
                )
            events.append({"type": "content_block_stop", "index": call.index})
        return events
