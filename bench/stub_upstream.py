"""A fast canonical OpenAI-compatible stub upstream for benchmarks (loopback only).

Plain asyncio HTTP/1.1 with keep-alive and every response body built once at
start-up, so the stub itself is never the bottleneck: ``POST
/v1/chat/completions`` answers ``--chunks`` content chunks (stream or not, with
usage when asked, in OpenAI's canonical envelope), ``POST /v1/embeddings`` answers
one vector of :data:`DIMENSIONS` numbers per input (base64 or numbers, as asked), ``GET
/v1/models`` lists one model.

``--hold`` makes slow streams for the memory test: each stream sends its role
chunk, then one content chunk every ``--delay`` seconds until ``POST
/bench/release``, then the rest of its chunks and ``[DONE]``; ``POST
/bench/hold`` holds new streams again. ``GET /bench/stats`` tells how many
streams are open, how many completions were served and how many connections
were accepted. ``--latency`` makes every completion and embedding wait that long
before its answer (GetBusbar's method: an upstream that answers after 20 ms).

For routing (``bench/routing.py``, the e2e routing proof): ``--first-token-delay``
waits that long before a completion's first byte (a slower deployment);
``--stream-seconds`` spreads a stream's content chunks over that many seconds (long
streams); ``--limit-after N --limit-seconds W --retry-after R`` answers 429 with
``Retry-After: R`` to every completion for W seconds once N were served (``POST
/bench/limit`` with ``{"seconds": W, "retry_after": R}`` starts such a window at
once); ``--record`` keeps each completion request's arrival (Unix time) and status
in the stats' ``arrivals``, which also count the 429s (``limited``).

    python bench/stub_upstream.py --port 9100 [--chunks 20] [--hold --delay 1] [--latency 0.02]
        [--first-token-delay 0.02] [--stream-seconds 0] [--limit-after N
        --limit-seconds 8 --retry-after 5] [--record]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import struct
import time

MODEL = "stub-model"
DIMENSIONS = 1536  # text-embedding-3-small's
ENVELOPE = {
    "id": "chatcmpl-stub",
    "object": "chat.completion.chunk",
    "created": 1700000000,
    "model": MODEL,
    "service_tier": "default",
    "system_fingerprint": "fp_stub",
}


def _dumps(payload: object) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


def _frame(payload: object) -> bytes:
    return b"data: " + _dumps(payload) + b"\n\n"


def _chunk(delta: dict[str, object], finish: str | None, usage: bool) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    payload: dict[str, object] = {**ENVELOPE, "choices": [choice]}
    if usage:
        payload["usage"] = None
    return _frame(payload)


def _usage(chunks: int) -> dict[str, object]:
    return {
        "prompt_tokens": 8,
        "completion_tokens": chunks,
        "total_tokens": 8 + chunks,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _http_chunk(data: bytes) -> bytes:
    """One piece of a ``Transfer-Encoding: chunked`` body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def _head(status: str, content_type: str, length: int | None = None) -> bytes:
    framing = "Transfer-Encoding: chunked" if length is None else f"Content-Length: {length}"
    return f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n{framing}\r\n\r\n".encode()


def _json_response(payload: object, status: str = "200 OK") -> bytes:
    body = _dumps(payload)
    return _head(status, "application/json", len(body)) + body


class Stub:
    """The canned responses, and the state of held streams."""

    def __init__(
        self,
        chunks: int,
        delay: float,
        hold: bool,
        latency: float = 0.0,
        *,
        first_token_delay: float = 0.0,
        stream_seconds: float = 0.0,
        limit_after: int | None = None,
        limit_seconds: float = 0.0,
        retry_after: float = 5.0,
        record: bool = False,
    ) -> None:
        self.chunks = chunks
        self.delay = delay
        self.hold = hold
        self.latency = latency
        self.first_token_delay = first_token_delay
        self.stream_seconds = stream_seconds
        self.limit_after = limit_after
        self.limit_seconds = limit_seconds
        self.retry_after = retry_after
        self.limited_until = 0.0  # time.time() when the current 429 window ends
        self.record = record
        self.arrivals: list[tuple[float, int]] = []
        self.limited = 0
        self.released = asyncio.Event()
        self.open_streams = 0
        self.served = 0
        self.connections = 0
        self.frames = {usage: self._frames(usage) for usage in (False, True)}
        self.streams = {
            usage: _head("200 OK", "text/event-stream")
            + b"".join(_http_chunk(frame) for frame in frames)
            + b"0\r\n\r\n"
            for usage, frames in self.frames.items()
        }
        self.completion = _json_response(
            {
                **ENVELOPE,
                "object": "chat.completion",
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": "tok " * chunks,
                            "refusal": None,
                            "annotations": [],
                        },
                        "logprobs": None,
                        "finish_reason": "stop",
                    }
                ],
                "usage": _usage(chunks),
            }
        )
        numbers = [((i * 7919) % 1000 - 500) / 12_500 for i in range(DIMENSIONS)]
        self.vectors = {
            False: _dumps(numbers),
            True: _dumps(base64.b64encode(struct.pack(f"<{DIMENSIONS}f", *numbers)).decode()),
        }
        self.models = _json_response(
            {
                "object": "list",
                "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "stub"}],
            }
        )

    def _frames(self, usage: bool) -> list[bytes]:
        """The SSE frames of one stream: role, content, finisher, [usage], [DONE]."""
        frames = [_chunk({"role": "assistant", "content": "", "refusal": None}, None, usage)]
        frames += [_chunk({"content": "tok "}, None, usage) for _ in range(self.chunks)]
        frames.append(_chunk({}, "stop", usage))
        if usage:
            frames.append(_frame({**ENVELOPE, "choices": [], "usage": _usage(self.chunks)}))
        frames.append(b"data: [DONE]\n\n")
        return frames

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer the requests of one keep-alive connection."""
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, *header_lines = head.decode("latin-1").split("\r\n")
                headers = {
                    name.strip().lower(): value.strip()
                    for name, _, value in (line.partition(":") for line in header_lines if line)
                }
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                method, path, _ = request_line.split(" ", 2)
                await self._route(method, path, body, writer)
                if headers.get("connection", "").lower() == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def _embeddings(self, body: bytes) -> bytes:
        """One canned vector per input, in the encoding asked for."""
        request = json.loads(body or b"{}")
        given = request.get("input")
        count = len(given) if isinstance(given, list) and not isinstance(given[0], int) else 1
        encoded = self.vectors[request.get("encoding_format") == "base64"]
        data = b",".join(
            b'{"object":"embedding","index":%d,"embedding":%s}' % (index, encoded)
            for index in range(count)
        )
        usage = b'{"prompt_tokens":%d,"total_tokens":%d}' % (count * 8, count * 8)
        body = b'{"object":"list","data":[%s],"model":"%s","usage":%s}' % (
            data,
            MODEL.encode(),
            usage,
        )
        return _head("200 OK", "application/json", len(body)) + body

    def _rate_limited(self) -> bytes | None:
        """The 429 to answer now, if within a window of them (which begins once
        ``limit_after`` completions were served)."""
        now = time.time()
        if self.limit_after is not None and self.served >= self.limit_after:
            self.limit_after = None
            self.limited_until = now + self.limit_seconds
        if now >= self.limited_until:
            return None
        self.limited += 1
        body = _dumps(
            {
                "error": {
                    "message": "Rate limit reached for requests",
                    "type": "requests",
                    "param": None,
                    "code": "rate_limit_exceeded",
                }
            }
        )
        return (
            f"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
            f"Retry-After: {self.retry_after:g}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body

    async def _route(
        self, method: str, path: str, body: bytes, writer: asyncio.StreamWriter
    ) -> None:
        if self.latency and method == "POST" and not path.startswith("/bench/"):
            await asyncio.sleep(self.latency)
        if method == "POST" and path.endswith("/embeddings"):
            writer.write(self._embeddings(body))
            self.served += 1
        elif method == "POST" and path.endswith("/chat/completions"):
            refusal = self._rate_limited()
            if self.record:
                self.arrivals.append((time.time(), 200 if refusal is None else 429))
            if refusal is not None:
                writer.write(refusal)
                await writer.drain()
                return
            if self.first_token_delay:
                await asyncio.sleep(self.first_token_delay)
            request = json.loads(body or b"{}")
            if not request.get("stream"):
                writer.write(self.completion)
            else:
                options = request.get("stream_options") or {}
                usage = isinstance(options, dict) and bool(options.get("include_usage"))
                if self.hold:
                    await self._held_stream(writer, usage)
                elif self.stream_seconds:
                    await self._long_stream(writer, usage)
                else:
                    writer.write(self.streams[usage])
            self.served += 1
        elif method == "GET" and path.endswith("/models"):
            writer.write(self.models)
        elif method == "POST" and path == "/bench/release":
            self.released.set()
            writer.write(_json_response({"released": self.open_streams}))
        elif method == "POST" and path == "/bench/hold":
            self.released.clear()
            writer.write(_json_response({"holding": True}))
        elif method == "POST" and path == "/bench/limit":
            asked = json.loads(body or b"{}")
            self.retry_after = float(asked.get("retry_after", self.retry_after))
            self.limited_until = time.time() + float(asked.get("seconds", 0))
            writer.write(_json_response({"limited_until": self.limited_until}))
        elif method == "GET" and path == "/bench/stats":
            stats = {
                "open_streams": self.open_streams,
                "served": self.served,
                "connections": self.connections,
                "limited": self.limited,
                "arrivals": self.arrivals,
            }
            writer.write(_json_response(stats))
        else:
            writer.write(_json_response({"error": {"message": "not found"}}, "404 Not Found"))
        await writer.drain()

    async def _held_stream(self, writer: asyncio.StreamWriter, usage: bool) -> None:
        """A slow stream: trickles a chunk every ``delay`` seconds until released."""
        self.open_streams += 1
        try:
            frames = self.frames[usage]
            writer.write(_head("200 OK", "text/event-stream") + _http_chunk(frames[0]))
            await writer.drain()
            trickle = _http_chunk(frames[1])
            while not self.released.is_set():
                try:
                    await asyncio.wait_for(self.released.wait(), self.delay)
                except TimeoutError:
                    writer.write(trickle)
                    await writer.drain()
            writer.write(b"".join(_http_chunk(frame) for frame in frames[1:]) + b"0\r\n\r\n")
        finally:
            self.open_streams -= 1

    async def _long_stream(self, writer: asyncio.StreamWriter, usage: bool) -> None:
        """A stream whose content chunks come spread over ``stream_seconds``."""
        self.open_streams += 1
        try:
            frames = self.frames[usage]
            writer.write(_head("200 OK", "text/event-stream") + _http_chunk(frames[0]))
            await writer.drain()
            pause = self.stream_seconds / max(1, self.chunks)
            for frame in frames[1 : 1 + self.chunks]:
                await asyncio.sleep(pause)
                writer.write(_http_chunk(frame))
                await writer.drain()
            writer.write(
                b"".join(_http_chunk(frame) for frame in frames[1 + self.chunks :]) + b"0\r\n\r\n"
            )
        finally:
            self.open_streams -= 1


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9100)
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--hold", action="store_true", help="hold streams until /bench/release")
    parser.add_argument("--delay", type=float, default=1.0, help="seconds between held chunks")
    parser.add_argument("--latency", type=float, default=0, help="seconds before each answer")
    parser.add_argument("--first-token-delay", type=float, default=0.0)
    parser.add_argument("--stream-seconds", type=float, default=0.0)
    parser.add_argument("--limit-after", type=int, default=None)
    parser.add_argument("--limit-seconds", type=float, default=0.0)
    parser.add_argument("--retry-after", type=float, default=5.0)
    parser.add_argument("--record", action="store_true", help="keep each request's arrival")
    return parser.parse_args(argv)


def stub_of(args: argparse.Namespace) -> Stub:
    return Stub(
        args.chunks,
        args.delay,
        args.hold,
        args.latency,
        first_token_delay=args.first_token_delay,
        stream_seconds=args.stream_seconds,
        limit_after=args.limit_after,
        limit_seconds=args.limit_seconds,
        retry_after=args.retry_after,
        record=args.record,
    )


async def main() -> None:
    args = arguments()
    stub = stub_of(args)
    server = await asyncio.start_server(stub.serve, args.host, args.port, backlog=4096)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
