"""An upstream that bills: it speaks the three APIs an ``openai`` backend calls
(``/chat/completions``, ``/responses``, ``/messages``), counts the prompt of each request
as a tokenizer at its worst would (a token for each UTF-8 byte of what the model reads,
and 10 for each message's markers), and answers as the request's model says:

- ``answers``: one choice, ``Hello`` (1 completion token), with its usage (a Messages
  upstream announces the prompt in ``message_start``, as Anthropic does);
- ``silent``: the same without any usage;
- ``hangs``: its first token (after ``message_start`` and its prompt, for Messages),
  then nothing more, the connection held open; a whole completion never comes.

A model named ``cached-<behaviour>`` behaves alike, and a Messages upstream says half
its prompt was read from its cache (``cache_read_input_tokens`` in ``message_start``).

It ignores ``n``: each request is answered with one choice. What each request was sent
and what it counted are kept in :attr:`MeteredUpstream.calls`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any

from tests.support.loopback import Loopback, read_request


@dataclass(frozen=True)
class Metered:
    """One request the upstream answered: its path, its body, its prompt's tokens."""

    path: str
    body: dict[str, Any]
    prompt_tokens: int


def _bytes(text: Any) -> int:
    return len(text.encode()) if isinstance(text, str) else 0


def _json_bytes(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"))) if value is not None else 0


def _read(part: Any) -> int:
    """The tokens of one message, item or block of any of the three APIs."""
    if isinstance(part, str):
        return _bytes(part)
    if isinstance(part, list):
        return sum(map(_read, part))
    if not isinstance(part, dict):
        return 0
    tokens = sum(_bytes(part.get(name)) for name in ("text", "arguments", "output"))
    if isinstance(part.get("input"), dict):  # an Anthropic tool use
        tokens += _json_bytes(part["input"])
    for call in part.get("tool_calls") or ():
        tokens += _bytes(call["function"]["arguments"]) + _bytes(call["function"]["name"])
    return tokens + _read(part.get("content"))


def prompt_tokens(body: dict[str, Any]) -> int:
    """What the model reads of ``body``, a token a byte: the messages (or input items, or
    turns and system prompt) and the tools' names, descriptions and schemas."""
    parts = body.get("messages") or body.get("input") or []
    tokens = sum(10 + _read(part) for part in parts) + _read(body.get("system"))
    for tool in body.get("tools") or ():
        function = tool.get("function", tool)
        tokens += _bytes(function.get("name")) + _bytes(function.get("description"))
        tokens += _json_bytes(function.get("parameters") or function.get("input_schema"))
    return tokens


def _sse(payload: dict[str, Any], event: str | None = None) -> str:
    return (f"event: {event}\n" if event else "") + f"data: {json.dumps(payload)}\n\n"


def _chat(model: str, prompt: int, *, usage: bool) -> list[str]:
    head = {"id": "chatcmpl-up", "object": "chat.completion.chunk", "created": 1, "model": model}
    delta = {"role": "assistant", "content": "Hello"}
    frames = [
        _sse({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}),
        _sse({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
    ]
    if usage:
        counts = {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1}
        frames.append(_sse({**head, "choices": [], "usage": counts}))
    return [*frames, "data: [DONE]\n\n"]


def _chat_whole(model: str, prompt: int, *, usage: bool) -> dict[str, Any]:
    message = {"role": "assistant", "content": "Hello"}
    counts = {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1}
    return {"id": "chatcmpl-up", "object": "chat.completion", "created": 1, "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": counts if usage else None}  # fmt: skip


def _responses(prompt: int, *, usage: bool) -> list[str]:
    item = {"id": "msg_up", "type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "Hello", "annotations": []}]}  # fmt: skip
    counts = {"input_tokens": prompt, "output_tokens": 1, "total_tokens": prompt + 1}
    done = {"id": "resp_up", "object": "response", "status": "completed", "output": [item],
            "usage": counts if usage else None}  # fmt: skip
    events = [
        {"type": "response.created", "response": {**done, "status": "in_progress",
                                                  "output": [], "usage": None}},
        {"type": "response.output_item.added", "output_index": 0,
         "item": {**item, "content": []}},
        {"type": "response.output_text.delta", "item_id": "msg_up", "output_index": 0,
         "delta": "Hello"},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": done},
    ]  # fmt: skip
    return [_sse(event, event["type"]) for event in events]


def _messages(model: str, prompt: int, *, usage: bool) -> list[str]:
    started = {"id": "msg_up", "type": "message", "role": "assistant", "model": model,
               "content": [], "stop_reason": None, "stop_sequence": None}  # fmt: skip
    if usage:
        read = prompt // 2 if model.startswith("cached-") else 0
        started["usage"] = {"input_tokens": prompt - read, "cache_read_input_tokens": read,
                            "output_tokens": 1}  # fmt: skip
    events = [
        {"type": "message_start", "message": started},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "text_delta", "text": "Hello"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
         **({"usage": {"output_tokens": 1}} if usage else {})},
        {"type": "message_stop"},
    ]  # fmt: skip
    return [_sse(event, event["type"]) for event in events]


def _frames(path: str, body: dict[str, Any], prompt: int, *, usage: bool) -> list[str]:
    """The stream answering ``body`` on ``path``; its first token is in the first
    ``FIRST[api]`` frames."""
    if path.endswith("/responses"):
        return _responses(prompt, usage=usage)
    if path.endswith("/messages"):
        return _messages(body["model"], prompt, usage=usage)
    return _chat(body["model"], prompt, usage=usage)


def _first_token(path: str) -> int:
    """How many frames of a stream on ``path`` carry its first token."""
    return 3 if path.endswith(("/responses", "/messages")) else 1


class MeteredUpstream(Loopback):
    """The server: its :attr:`base_url`, and each request it answered (:class:`Metered`)
    in :attr:`calls`."""

    def __init__(self) -> None:
        self.calls: list[Metered] = []
        self.holding = 0
        """Streams held open after their first token now: tests wait for them."""
        super().__init__(self._connection)
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def sent(self, model: str) -> list[Metered]:
        """The requests for ``model``, in order."""
        return [call for call in self.calls if call.body["model"] == model]

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:  # kept alive
                path, body = await read_request(reader)
                self.calls.append(Metered(path, body, prompt_tokens(body)))
                await self._answer(reader, writer, path, body)
        writer.close()

    async def _answer(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        path: str,
        body: dict[str, Any],
    ) -> None:
        model, prompt = body["model"].removeprefix("cached-"), self.calls[-1].prompt_tokens
        usage = model != "silent"
        if not body.get("stream"):
            if model == "hangs":
                await self._hold(reader)
            payload = json.dumps(_chat_whole(body["model"], prompt, usage=usage)).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(payload)}\r\n\r\n".encode()
                + payload
            )
            await writer.drain()
            return
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        frames = _frames(path, body, prompt, usage=usage)
        if model == "hangs":
            frames = frames[: _first_token(path)]
        for frame in frames:
            await _chunk(writer, frame.encode())
        if model == "hangs":
            await self._hold(reader)
        await _chunk(writer, b"")

    async def _hold(self, reader: asyncio.StreamReader) -> None:
        """Answer nothing more until the client closes the connection."""
        self.holding += 1
        try:
            while await reader.read(1024):
                pass
        finally:
            self.holding -= 1
        raise ConnectionError("the client left")


async def _chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    """One chunk of a chunked body (the empty one ends it)."""
    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    await writer.drain()
