"""A real HTTP upstream on loopback that misbehaves on request.

The ``model`` of each request picks the behaviour (see :func:`behaviours`), so one
server serves every test. It speaks raw HTTP/1.1 over asyncio streams, with
chunked bodies, so it can also break the protocol: reset a connection, drop it
mid-body, never finish. Responses say ``Connection: close`` and the connection
is closed after them, except the ``keep-alive`` behaviours' which keep it open
for the next request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field


def chunk(content: str | None = None, *, index=0, finish=None, role=None, **extra) -> dict:
    """A canonical chunk; tests vary it to make quirks."""
    delta = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    return {
        "id": "up-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": index, "delta": delta, "finish_reason": finish}],
        **extra,
    }


def data(payload) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


CANONICAL = [
    data(chunk(role="assistant", content="")),
    data(chunk("Hello")),
    data(chunk(" world")),
    data(chunk(finish="stop")),
    data(
        {
            **chunk(),
            "choices": [],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
        }
    ),
    "data: [DONE]\n\n",
]

QUIRKY = [
    ": keepalive\n\n",
    data({**chunk("Hel", role="assistant"), "id": "a", "created": 1}),  # role and content together
    data({**chunk(role="assistant"), "id": "b", "created": 2}),  # a repeated role, another id
    "event: message\ndata: " + json.dumps(chunk("lo")) + "\n\n",
    data(chunk("!", finish="stop")),  # finish_reason on a content chunk
    data(chunk("after the end")),  # content after the finisher
    # no usage, no [DONE]
]


# A model that reasons first, as vLLM, llama.cpp and DeepSeek stream it.
REASONING = [
    data(chunk(role="assistant", content="")),
    *(
        data({**chunk(), "choices": [{"index": 0, "delta": {"reasoning_content": thought}}]})
        for thought in ("The user ", "greets me.")
    ),
    *CANONICAL[1:],
]


def tool_delta(arguments: str) -> dict:
    """A tool-call chunk that repeats the call's id, type and name, as some servers do."""
    function = {"name": "get_weather", "arguments": arguments}
    call = {"index": 0, "id": "call_1", "type": "function", "function": function}
    return {**chunk(), "choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}


TOOL_QUIRKS = [
    data(tool_delta('{"ci')),
    data(tool_delta('ty": "Paris"}')),  # the id and name repeated on a later delta
    data(chunk(finish="tool_calls")),
    "data: [DONE]\n\n",
]

LONG_CHUNKS = 20
LONG = [
    data(chunk(role="assistant", content="")),
    *(data(chunk(f"t{i} ")) for i in range(LONG_CHUNKS)),
    data(chunk(finish="stop")),
    data(
        {
            **chunk(),
            "choices": [],
            "usage": {"prompt_tokens": 5, "completion_tokens": LONG_CHUNKS, "total_tokens": 25},
        }
    ),
    "data: [DONE]\n\n",
]


def _capped(max_tokens: int | None) -> list[str]:
    """LONG, cut at ``max_tokens`` completion tokens with finish ``length``, as a server
    that honours its request's ``max_tokens``."""
    if max_tokens is None or max_tokens >= LONG_CHUNKS:
        return LONG
    usage = {"prompt_tokens": 5, "completion_tokens": max_tokens, "total_tokens": 5 + max_tokens}
    return [
        *LONG[: 1 + max_tokens],
        data(chunk(finish="length")),
        data({**chunk(), "choices": [], "usage": usage}),
        LONG[-1],
    ]


def _with_usage(completion_tokens: int) -> list[str]:
    """LONG, its usage claiming ``completion_tokens``."""
    usage = {"prompt_tokens": 5, "completion_tokens": completion_tokens, "total_tokens": 5}
    return [*LONG[:-2], data({**chunk(), "choices": [], "usage": usage}), LONG[-1]]


HUGE_BYTES = 10 * 1024 * 1024
_PIECE = "x" * 8192


def _huge_stream() -> list[str]:
    """About HUGE_BYTES of content in 8 KiB deltas, one frame object repeated."""
    piece = data(chunk(_PIECE))
    return [data(chunk(role="assistant", content="")), *[piece] * (HUGE_BYTES // len(_PIECE))]


LONG_LINE = 4096  # bytes: the cap the tests set (CHATPARITY["MAX_UPSTREAM_LINE_BYTES"])
OVERLONG = data(chunk("x" * LONG_LINE))

# A Messages stream whose body ends (properly framed) before the message says why it stopped.
MESSAGE_CUT = [
    f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
    for event in (
        {"type": "message_start", "message": {"id": "msg_1", "type": "message",
         "role": "assistant", "model": "m", "content": [], "stop_reason": None,
         "usage": {"input_tokens": 5, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}},
    )
]  # fmt: skip

ERROR_EVENT = [
    data(chunk(role="assistant", content="")),
    data(chunk("partial")),
    'event: error\ndata: {"error": {"message": "overloaded", "type": "server_error"}}\n\n',
]


@dataclass
class FaultyUpstream:
    """The running server: its base URL and what it saw."""

    port: int
    secret: str
    attempts: Counter = field(default_factory=Counter)
    bodies: dict[str, dict] = field(default_factory=dict)
    heads: dict[str, str] = field(default_factory=dict)
    in_flight: int = 0
    closed: dict[str, float] = field(default_factory=dict)
    connections: int = 0  # accepted

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


Handler = Callable[[asyncio.StreamWriter], Awaitable[bool | None]]  # True: keep it open


async def _head(writer, status=200, content_type="text/event-stream", *, close=True):
    writer.write(
        f"HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\nTransfer-Encoding: chunked\r\n"
        f"{'Connection: close' if close else 'Connection: keep-alive'}\r\n\r\n".encode()
    )
    await writer.drain()


async def _send(writer, text: str):
    body = text.encode()
    writer.write(f"{len(body):x}\r\n".encode() + body + b"\r\n")
    await writer.drain()


async def _end(writer):
    writer.write(b"0\r\n\r\n")
    await writer.drain()


async def _stream(writer, frames, *, end=True, pause=0.0, close=True):
    await _head(writer, close=close)
    if not close:
        # The last frame and the end of the body in one write, as real servers often do:
        # the connection is back in the client's pool before its next request.
        *frames, last = frames
    for frame in frames:
        await _send(writer, frame)
        await asyncio.sleep(pause)
    if not close:
        body = last.encode()
        writer.write(f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n")
        await writer.drain()
    elif end:
        await _end(writer)
    return not close


async def _json(writer, status, payload, *, close=True):
    await _head(writer, status, "application/json", close=close)
    await _send(writer, json.dumps(payload))
    await _end(writer)
    return not close


WHOLE = {
    "id": "up-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello world", "refusal": None},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
}
WHOLE_TOOL_CALLS = {
    **WHOLE,
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{city}",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": f'{{"city":"{city}"}}'},
                    }
                    for city in ("Paris", "Rome")
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
}


def behaviours(upstream: FaultyUpstream) -> dict[str, Handler]:
    async def fail_twice_then_answer(writer):
        if upstream.attempts["flaky"] <= 2:
            await _json(writer, 503, {"error": {"message": "busy", "type": "server_error"}})
        else:
            await _stream(writer, CANONICAL)

    async def endless(writer):
        await _head(writer)
        await _send(writer, data(chunk(role="assistant", content="")))
        await _send(writer, data(chunk("and on")))
        while True:
            await _send(writer, ": keepalive\n\n")
            await asyncio.sleep(0.05)

    async def slow_tokens(writer):
        await _head(writer)
        await _send(writer, data(chunk(role="assistant", content="")))
        while True:
            await _send(writer, data(chunk("tick ")))
            await asyncio.sleep(0.05)

    async def retry_after(writer):
        body = json.dumps({"error": {"message": "slow down", "type": "requests"}}).encode()
        writer.write(
            b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
            b"Retry-After: 7\r\nConnection: close\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()

    async def slow_first_byte(writer):
        await asyncio.sleep(30)

    async def silent(writer):
        # Accepted, never answered (beyond any first-byte timeout); quiet when the
        # server stops with it still waiting.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(120)

    async def html(writer):
        await _head(writer, 200, "text/html")
        await _send(writer, "<html><body>Sign in to continue</body></html>")
        await _end(writer)

    async def huge_line(writer):
        await _head(writer)
        await _send(writer, data(chunk(role="assistant", content="")))
        await _send(writer, data(chunk("x" * HUGE_BYTES)))
        await _end(writer)

    return {
        "canonical": lambda w: _stream(w, CANONICAL),
        "reasoning": lambda w: _stream(w, REASONING),
        "quirky": lambda w: _stream(w, QUIRKY),
        "tool-quirks": lambda w: _stream(w, TOOL_QUIRKS),
        "error-event": lambda w: _stream(w, ERROR_EVENT),
        "malformed": lambda w: _stream(w, [*CANONICAL[:2], "data: {not json\n\n"]),
        "malformed-first": lambda w: _stream(w, ["data: {not json\n\n"]),
        "drop": lambda w: _stream(w, CANONICAL[:3], end=False),
        "reset": _reset_async,
        "bad-request": lambda w: _json(
            w,
            400,
            {
                "error": {
                    "message": f"Bad key {upstream.secret} for this model",
                    "type": "invalid_request_error",
                    "param": "model",
                    "code": "model_not_found",
                }
            },
        ),
        "leaky-error": lambda w: _json(
            w,
            400,
            {
                "error": {
                    "message": f"vllm-0.internal.corp:8000 refused key {upstream.secret[:5]}***",
                    "type": "error at 10.0.0.7",
                    "param": "see http://10.0.0.7/",
                    "code": "no route to 10.0.0.7",
                }
            },
        ),
        "rate-limited": lambda w: _json(
            w, 429, {"error": {"message": "slow down", "type": "requests", "code": "rate_limit"}}
        ),
        "server-error": lambda w: _json(w, 500, {"error": {"message": "boom"}}),
        "retry-after": retry_after,
        # Anthropic's envelope and its status for a service too busy.
        "overloaded": lambda w: _json(
            w,
            529,
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        ),
        "not-json-error": lambda w: _json(w, 502, "<html>bad gateway</html>"),
        "message-cut": lambda w: _stream(w, MESSAGE_CUT),
        "flaky": fail_twice_then_answer,
        "slow-first-byte": slow_first_byte,
        "endless": endless,
        "slow-tokens": slow_tokens,
        "long": lambda w: _stream(w, LONG, pause=0.01),
        "long-slow": lambda w: _stream(w, LONG, pause=0.1),
        # Read as it is called, before any await: the body of this very request.
        "long-capped": lambda w: _stream(
            w, _capped(upstream.bodies["long-capped"].get("max_tokens")), pause=0.01
        ),
        # Garbage a careless or broken upstream sends.
        "negative-usage": lambda w: _stream(w, _with_usage(-5), pause=0.01),
        "huge-usage": lambda w: _stream(w, _with_usage(3_000_000_000), pause=0.01),
        "html": html,
        "huge-line": huge_line,
        "huge-stream": lambda w: _stream(w, _huge_stream()),
        "silent": silent,
        "keep-alive": lambda w: _stream(w, CANONICAL, close=False),
        # Whole completions, as an upstream answers a request that does not stream.
        "whole": lambda w: _json(w, 200, WHOLE, close=False),
        "whole-tool-calls": lambda w: _json(w, 200, WHOLE_TOOL_CALLS),
        "whole-without-usage": lambda w: _json(w, 200, {**WHOLE, "usage": None}),
        # A line over the tests' cap, before the first event or after; no choice at all.
        "long-line-first": lambda w: _stream(w, [OVERLONG, "data: [DONE]\n\n"], close=False),
        "long-line": lambda w: _stream(w, [*CANONICAL[:2], OVERLONG, *CANONICAL[2:]], pause=0.02),
        "empty-stream": lambda w: _stream(w, ["data: [DONE]\n\n"]),
        "keep-alive-busy": lambda w: _json(
            w, 503, {"error": {"message": "busy", "type": "server_error"}}, close=False
        ),
        "keep-alive-bad-request": lambda w: _json(
            w, 400, {"error": {"message": "no", "type": "invalid_request_error"}}, close=False
        ),
    }


async def _reset_async(writer):
    """Close with RST: the client sees its connection reset before any response."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _serve(upstream: FaultyUpstream, started: threading.Event, holder: list) -> None:
    table = behaviours(upstream)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        behaviour = "?"
        upstream.connections += 1
        upstream.in_flight += 1
        try:
            keep_open = True
            while keep_open:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.decode().split("\r\n"):
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                body = json.loads(await reader.readexactly(length))
                behaviour = body["model"]
                upstream.attempts[behaviour] += 1
                upstream.bodies[behaviour] = body
                upstream.heads[behaviour] = head.decode().lower()
                keep_open = bool(await table[behaviour](writer))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            upstream.in_flight -= 1
            upstream.closed[behaviour] = time.monotonic()
            with contextlib.suppress(Exception):
                writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    upstream.port = server.sockets[0].getsockname()[1]
    holder.append((asyncio.get_running_loop(), server))
    started.set()
    with contextlib.suppress(asyncio.CancelledError):
        async with server:
            await server.serve_forever()


def start(secret: str) -> tuple[FaultyUpstream, Callable[[], None]]:
    """Serve in a thread of its own; return the server and a function that stops it."""
    upstream = FaultyUpstream(port=0, secret=secret)
    started = threading.Event()
    holder: list = []
    thread = threading.Thread(
        target=lambda: asyncio.run(_serve(upstream, started, holder)), daemon=True
    )
    thread.start()
    started.wait(5)

    def stop() -> None:
        loop, server = holder[0]
        loop.call_soon_threadsafe(server.close)

    return upstream, stop
