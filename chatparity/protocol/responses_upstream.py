"""Calling an upstream that speaks the Responses API natively (``wire_api: responses``).

:func:`upstream_request` writes a chat request (whichever endpoint it came
from) as a ``POST /responses`` body, and :class:`ResponsesEventReader` reads
the typed events (or the whole response) the upstream answers back into
normalized backend events. The reader is a
:class:`~chatparity.protocol.upstream.ChunkReader`: each event is read as the
chat delta it stands for, so every repair and every distrust of the chat path
applies (ids, finishers, usage not believed, errors not passed on).
"""

from __future__ import annotations

from typing import Any

from .events import Event
from .request import PROMPT_CACHE_PARAMETERS, ChatRequest, Message
from .responses import MIN_OUTPUT_TOKENS
from .upstream import (
    ChunkReader,
    ServerSentEvent,
    believable_usage,
    malformed,
    upstream_error,
    well_shaped,
)

# Why an upstream's response is incomplete -> the finish reason it stands for.
_FINISH = {"max_output_tokens": "length", "content_filter": "content_filter"}


def upstream_request(request: ChatRequest, model: str, forwarded: dict[str, Any]) -> dict[str, Any]:
    """The ``/responses`` body asking ``model`` what ``request`` asks (the hosted tools
    of a Responses request with it), streamed and not stored upstream. ``forwarded``:
    the chat parameters the backend passes on (its sampling and format ones, and those
    the alias forwards), read from here."""
    body: dict[str, Any] = {
        "model": model or request.model,
        "input": [item for message in request.messages for item in _items(message)],
        "stream": True,
        "store": False,
    }
    # The prompt cache's parameters are the same in both APIs.
    for name in ("temperature", "top_p", "parallel_tool_calls", "user", "metadata",
                 *PROMPT_CACHE_PARAMETERS):  # fmt: skip
        if name in forwarded:
            body[name] = forwarded[name]
    if "service_tier" in forwarded:
        body["service_tier"] = forwarded["service_tier"]
    if request.most_completion_tokens is not None:
        # OpenAI's smallest cap: a smaller one is asked as it (the answer may be longer).
        body["max_output_tokens"] = max(request.most_completion_tokens, MIN_OUTPUT_TOKENS)
    if request.reasoning_effort is not None and "reasoning_effort" in forwarded:
        body["reasoning"] = {"effort": request.reasoning_effort}
    if request.tools and "tools" in forwarded:
        body["tools"] = [
            {
                "type": "function",
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters or {"type": "object", "properties": {}},
                "strict": tool.strict,
            }
            for tool in request.tools
        ]
        choice = request.tool_choice
        body["tool_choice"] = (
            {"type": "function", "name": choice.name} if choice.mode == "function" else choice.mode
        )
    if request.hosted_tools:  # the upstream runs them: its answer says what they found
        body["tools"] = [*body.get("tools", ()), *request.hosted_tools]
    spec = request.response_format
    if spec is not None and "response_format" in forwarded:
        text_format: dict[str, Any] = {"type": spec.type}
        if spec.type == "json_schema":
            text_format |= {"name": spec.name, "schema": spec.schema, "strict": spec.strict}
        body["text"] = {"format": text_format}
    return body


def _items(message: Message) -> list[dict[str, Any]]:
    """One chat message as Responses input items."""
    if message.role == "tool":
        return [
            {
                "type": "function_call_output",
                "call_id": message.tool_call_id,
                "output": message.content or "",
            }
        ]
    role = "user" if message.role == "function" else message.role
    items: list[dict[str, Any]] = []
    if message.content or not message.tool_calls:
        kind = "output_text" if role == "assistant" else "input_text"
        content = [{"type": kind, "text": message.content or ""}]
        items.append({"type": "message", "role": role, "content": content})
    for call in message.tool_calls or ():
        function = call["function"]
        items.append(
            {
                "type": "function_call",
                "call_id": call["id"],
                "name": function["name"],
                "arguments": function["arguments"],
            }
        )
    return items


class ResponsesEventReader(ChunkReader):
    """Normalized events from one upstream response (one choice: ``n`` is 1), read from
    its typed stream events or its whole response object."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._slots: dict[str, int] = {}  # a function call's item id -> its call index
        self._sent: dict[str, int] = {}  # an item's id -> characters of it streamed

    def read(self, sse: ServerSentEvent) -> list[Event]:
        if sse.data.strip() == "[DONE]":
            self.done = True
            return []
        # An error event is read by its type: its fields are an error's, not in an envelope.
        event = self._payload(sse.data, "an event")
        with well_shaped(sse.data):
            return self._event(event, sse.data)

    def read_completion(self, body: bytes) -> list[Event]:
        """The events of a whole response object (an upstream that did not stream)."""
        self.done = True
        response = self._payload(body, "the response")
        with well_shaped(body):
            events = [
                event
                for output_index, item in enumerate(response.get("output") or ())
                if isinstance(item, dict)
                for event in self._whole_item(item, output_index)
            ]
            return events + self._end(response)

    def _event(self, event: dict[str, Any], sent: str) -> list[Event]:
        kind = event.get("type")
        item_id = str(event.get("item_id", ""))
        if kind == "response.output_text.delta":
            return self._text(item_id, event["delta"])
        if kind == "response.output_text.done":
            return self._text(item_id, event["text"][self._sent.get(item_id, 0) :])
        if kind == "response.output_item.added":
            item = event["item"]
            return self._open_call(item) if item.get("type") == "function_call" else []
        if kind == "response.function_call_arguments.delta":
            return self._arguments(item_id, event["delta"])
        if kind == "response.function_call_arguments.done":
            return self._arguments(item_id, event["arguments"][self._sent.get(item_id, 0) :])
        if kind == "response.output_item.done":
            item = event["item"]
            return self._whole_item(item, event.get("output_index", 0))
        if kind in ("response.completed", "response.incomplete"):
            self.done = True
            return self._end(event["response"])
        if kind == "response.failed":
            raise _failed(event["response"].get("error"), sent)
        if kind == "error":
            raise _failed(event, sent)
        return []  # created, in_progress, content parts, reasoning: nothing to pass on

    def _text(self, item_id: str, text: str) -> list[Event]:
        if not isinstance(text, str):
            raise TypeError("text is not a string")
        if not text:
            return []
        self._sent[item_id] = self._sent.get(item_id, 0) + len(text)
        return self._choice({"index": 0, "delta": {"content": text}})

    def _open_call(self, item: dict[str, Any]) -> list[Event]:
        item_id = str(item.get("id") or item.get("call_id"))
        if item_id in self._slots:
            return []
        slot = self._slots[item_id] = len(self._slots)
        call = {"index": slot, "id": item.get("call_id"), "function": {"name": item.get("name")}}
        return self._choice({"index": 0, "delta": {"tool_calls": [call]}})

    def _arguments(self, item_id: str, arguments: str) -> list[Event]:
        if not isinstance(arguments, str):
            raise TypeError("arguments are not a string")
        if not arguments or item_id not in self._slots:
            return []
        self._sent[item_id] = self._sent.get(item_id, 0) + len(arguments)
        call = {"index": self._slots[item_id], "function": {"arguments": arguments}}
        return self._choice({"index": 0, "delta": {"tool_calls": [call]}})

    def _whole_item(self, item: dict[str, Any], output_index: int) -> list[Event]:
        """What of a finished item was not streamed (all of it, in a whole response)."""
        item_id = str(item.get("id") or f"output_{output_index}")
        if item.get("type") == "message":
            text = "".join(
                part["text"]
                for part in item.get("content") or ()
                if part.get("type") == "output_text"
            )
            return self._text(item_id, text[self._sent.get(item_id, 0) :])
        if item.get("type") == "function_call":
            item = {**item, "id": item_id}
            arguments = item.get("arguments") or ""
            events = self._open_call(item)
            return events + self._arguments(item_id, arguments[self._sent.get(item_id, 0) :])
        return []

    def _end(self, response: dict[str, Any]) -> list[Event]:
        usage = response.get("usage")
        if isinstance(usage, dict):
            self._believe(usage)
        details = response.get("incomplete_details") or {}
        reason = _FINISH.get(str(details.get("reason")), "stop")
        return self._choice({"index": 0, "delta": {}, "finish_reason": reason})

    def _believe(self, usage: dict[str, Any]) -> None:
        """The upstream's usage, in the Responses API's names, if it can be believed."""
        input_details = usage.get("input_tokens_details") or {}
        output_details = usage.get("output_tokens_details") or {}
        if not isinstance(input_details, dict) or not isinstance(output_details, dict):
            input_details = output_details = {"cached_tokens": None}
        chat_usage = {
            "prompt_tokens": usage.get("input_tokens"),
            "completion_tokens": usage.get("output_tokens"),
            "prompt_tokens_details": {"cached_tokens": input_details.get("cached_tokens")},
            "completion_tokens_details": {
                "reasoning_tokens": output_details.get("reasoning_tokens")
            },
        }
        self.upstream_usage = believable_usage(chat_usage, self.most_completion_tokens)
        self.refused_usage = None if self.upstream_usage else usage


def _failed(error: Any, sent: str) -> Exception:
    """A failed response's error (or an error event), as the upstream error clients are
    told."""
    if not isinstance(error, dict):
        return malformed("a failed response without its error", sent)
    return upstream_error({"error": error})
