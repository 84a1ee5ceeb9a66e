"""Backend events -> the Responses API's typed stream events and its response object.

:class:`ResponseEncoder` is the Responses encoding of the same event stream
:class:`~chatparity.protocol.stream.ChunkEncoder` encodes as chat chunks. It
numbers its events (``sequence_number``) and keeps the response they add up to:
the non-stream object is :meth:`ResponseEncoder.response` once every event was
encoded, the very object the final event carries, so the two cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import orjson

from . import ids
from .errors import APIError
from .events import Event, Finish, ReasoningDelta, TextDelta, ToolCallDelta, Usage
from .responses import NO_NAMESPACES, NewId, ToolNames

ResponseStatus = Literal["completed", "incomplete", "failed", "in_progress"]
RESPONSE_STATUSES: tuple[ResponseStatus, ...] = get_args(ResponseStatus)

EventType = Literal[
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.output_item.done",
    "response.completed",
    "response.incomplete",
    "response.failed",
]
EVENT_TYPES: tuple[EventType, ...] = get_args(EventType)
"""The events a response streams, in the order they first come."""

# Why a choice ended -> why its response is incomplete (other reasons complete it).
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


_HEADS: dict[str, bytes] = {kind: f"event: {kind}\ndata: ".encode() for kind in EVENT_TYPES}


def sse_event(event: dict[str, Any]) -> bytes:
    """One server-sent event with its ``event:`` line, as OpenAI sends Responses events."""
    kind: str = event["type"]
    head = _HEADS.get(kind) or f"event: {kind}\ndata: ".encode()
    return head + orjson.dumps(event) + b"\n\n"


def usage_object(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


def response_error(error: APIError) -> dict[str, str]:
    """A failure as a failed response's ``error``: OpenAI's codes there are few."""
    code = "rate_limit_exceeded" if error.status == 429 else "server_error"
    return {"code": code, "message": error.message}


@dataclass
class _Item:
    """An output item being streamed: a message's text or a function call's arguments."""

    index: int
    fields: dict[str, Any]
    fragments: list[str] = field(default_factory=list)
    has_part: bool = False
    """A message's text part was added (its content is empty until then)."""
    done: bool = False
    id: str = field(init=False)
    is_message: bool = field(init=False)

    def __post_init__(self) -> None:
        self.id = self.fields["id"]
        self.is_message = self.fields["type"] == "message"

    def value(self, status: str) -> dict[str, Any]:
        """The item as it stands, with ``status`` unless it is done."""
        text = "".join(self.fragments)
        item = {**self.fields, "status": self.fields["status"] if self.done else status}
        if self.is_message:
            item["content"] = [_text_part(text)] if self.has_part else []
        else:
            item["arguments"] = text
        return item


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}


class ResponseEncoder:
    """Turns one request's backend events into OpenAI's Responses stream events.

    :meth:`opening` gives ``response.created`` and ``response.in_progress``,
    :meth:`encode` the events of each backend event (choice 0: a response has
    one), :meth:`closing` the end (``response.completed`` or
    ``response.incomplete``) and :meth:`failing` a failure (``response.failed``).
    An output item is done when the next one begins, or the choice finishes.
    Not ``streaming``, it makes no event of each delta: only the response is sent.
    A call of a function by the flat name ``names`` gave it is a call of the
    namespace's function, with its ``namespace``.
    """

    def __init__(
        self,
        *,
        response_id: str,
        created_at: int,
        model: str,
        settings: dict[str, Any],
        new_id: NewId,
        streaming: bool = True,
        names: ToolNames = NO_NAMESPACES,
    ) -> None:
        self._new_id = new_id
        self._names = names
        self._streaming = streaming
        self._base = {"id": response_id, "object": "response", "created_at": created_at}
        self._model = model
        self._settings = settings
        self._sequence = 0
        self._items: list[_Item] = []
        self._current: _Item | None = None
        self._calls: dict[int, _Item] = {}
        self._status = "in_progress"
        self._incomplete: dict[str, str] | None = None
        self._error: dict[str, str] | None = None
        self._usage: dict[str, Any] | None = None
        self._final: dict[str, Any] | None = None

    def response(self) -> dict[str, Any]:
        """The response object as it stands (once closed: the whole response, made once)."""
        if self._final is not None:
            return self._final
        item_status = "in_progress" if self._status == "in_progress" else "incomplete"
        return {
            **self._base,
            "status": self._status,
            "background": False,
            "error": self._error,
            "incomplete_details": self._incomplete,
            "model": self._model,
            "output": [item.value(item_status) for item in self._items],
            **self._settings,
            "usage": self._usage,
        }

    def opening(self) -> list[dict[str, Any]]:
        response = self.response()
        return [
            self._event("response.created", response=response),
            self._event("response.in_progress", response=response),
        ]

    def encode(self, event: Event) -> list[dict[str, Any]]:
        if isinstance(event, TextDelta):  # most events: checked first
            return self._text(event.text) if event.index == 0 else []
        if isinstance(event, Usage):
            self._usage = usage_object(event)
            return []
        if event.index != 0 or isinstance(event, ReasoningDelta):
            # An alias's default n above 1: a response has one choice. Reasoning: its
            # items carry no text here.
            return []
        if isinstance(event, ToolCallDelta):
            return self._call(event)
        return self._finish(event)

    def closing(self) -> list[dict[str, Any]]:
        """The events that end a response whose backend sent everything."""
        events = self._close_current("completed")
        if self._status == "in_progress":
            self._status = "completed"
        kind = "response.completed" if self._status == "completed" else "response.incomplete"
        self._final = self.response()
        return [*events, self._event(kind, response=self._final)]

    def failing(self, error: APIError) -> list[dict[str, Any]]:
        """The events that end a response whose backend failed."""
        self._status = "failed"
        self._error = response_error(error)
        self._final = None  # closing made it, then its store or its last write failed
        self._final = self.response()
        return [self._event("response.failed", response=self._final)]

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _open(self, fields: dict[str, Any]) -> tuple[_Item, list[dict[str, Any]]]:
        events = self._close_current("completed")
        item = _Item(len(self._items), {**fields, "status": "in_progress"})
        self._items.append(item)
        self._current = item
        added = self._event(
            "response.output_item.added", output_index=item.index, item=item.value("in_progress")
        )
        return item, [*events, added]

    def _text(self, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        item = self._current
        if item is None or not item.is_message:
            item, events = self._open_message()
        item.fragments.append(text)
        if not self._streaming:  # only the response is sent: no event for each token
            return events
        # As _event with _where would make it, written out: one for each token streamed.
        sequence = self._sequence
        self._sequence = sequence + 1
        events.append(
            {
                "type": "response.output_text.delta",
                "sequence_number": sequence,
                "item_id": item.id,
                "output_index": item.index,
                "content_index": 0,
                "delta": text,
                "logprobs": [],
            }
        )
        return events

    def _open_message(self) -> tuple[_Item, list[dict[str, Any]]]:
        message = {"id": self._new_id("msg"), "type": "message", "role": "assistant", "content": []}
        item, events = self._open(message)
        item.has_part = True
        part = self._event("response.content_part.added", **self._where(item), part=_text_part(""))
        return item, [*events, part]

    def _call(self, delta: ToolCallDelta) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        item = self._calls.get(delta.call_index)
        if item is None:
            call = {
                "id": self._new_id("fc"),
                "type": "function_call",
                "call_id": delta.id or ids.call_id(),  # OpenAI's form, not new_id's
                **self._names.called(delta.name or ""),
                "arguments": "",
            }
            item, events = self._open(call)
            self._calls[delta.call_index] = item
        if delta.arguments:
            item.fragments.append(delta.arguments)
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item.id,
                    output_index=item.index,
                    delta=delta.arguments,
                )
            )
        return events

    def _finish(self, finish: Finish) -> list[dict[str, Any]]:
        """Close the last item; an answer of nothing is one empty message, as a chat
        completion's is an empty content."""
        events = [] if self._items else self._open_message()[1]
        reason = _INCOMPLETE.get(finish.reason)
        if reason is None:
            return [*events, *self._close_current("completed")]
        self._status = "incomplete"
        self._incomplete = {"reason": reason}
        return [*events, *self._close_current("incomplete")]

    def _where(self, item: _Item) -> dict[str, Any]:
        return {"item_id": item.id, "output_index": item.index, "content_index": 0}

    def _close_current(self, status: str) -> list[dict[str, Any]]:
        item, self._current = self._current, None
        if item is None:
            return []
        value = item.value(status)
        item.fields["status"] = status
        item.done = True
        if item.is_message:
            part = value["content"][0]
            events = [
                self._event(
                    "response.output_text.done", **self._where(item), text=part["text"], logprobs=[]
                ),
                self._event("response.content_part.done", **self._where(item), part=part),
            ]
        else:
            events = [
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item.id,
                    output_index=item.index,
                    name=value["name"],
                    arguments=value["arguments"],
                )
            ]
        events.append(self._event("response.output_item.done", output_index=item.index, item=value))
        return events
