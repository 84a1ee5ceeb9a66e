"""Scripted doubles: a backend that replays a script from its options (the test double
for failure paths), and an upstream that answers a conversation turn by turn.

Real backends are tested against the real model and real upstreams; the
backend makes a backend fail at an exact point, which real programs cannot be
asked to, and the upstream makes a model call the function a test needs (a
small model cannot be made to), for clients that run a task to its end.
"""

import asyncio
import base64
import contextlib
import json
import math
import struct
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from chatparity.backends.base import BackendConfig
from chatparity.protocol.embeddings import Embeddings, EmbeddingsRequest
from chatparity.protocol.errors import APIError
from chatparity.protocol.events import Event, Finish, TextDelta, ToolCallDelta, Usage
from chatparity.protocol.request import ChatRequest
from chatparity.protocol.upstream import UpstreamError

# CHATPARITY settings that add the "scripted" backend kind.
SCRIPTED = {
    "BACKEND_CLASSES": {
        "scripted": "tests.scripted.ScriptedBackend",
        "scripted-embedder": "tests.scripted.ScriptedEmbedder",
    }
}


class ScriptedBackend:
    """``options["script"]``: a list of text pieces, ``"<fail>"``, ``"<error>"``,
    ``"<rate-limited>"`` (an upstream's 429, with ``options["retry_after"]`` seconds
    when given), ``"<refuse>"`` (a 400), ``"<hang>"``, function calls (``{"call": name,
    "arguments": json_text}``) or ``"<call every tool>"`` (a call of each function
    offered, in order, with ``{}``). Each step is a completion token: a request's token
    limit cuts the script there. Its usage: a prompt token, else ``options["usage"]`` (a
    prompt's tokens, cache reads and writes as :class:`Usage` names them)."""

    system_fingerprint = "fp_scripted"
    hanging = 0
    """How many streams wait at a ``"<hang>"`` now: tests wait for that, not for a time."""
    asked: list[ChatRequest] = []
    """Every request a scripted backend was given, in order (tests clear it)."""

    def __init__(self, config: BackendConfig) -> None:
        self.config = config

    @staticmethod
    def price_provider(options: dict[str, Any]) -> str | None:
        """``options["provider"]``: whose prices its aliases' blank cache prices follow."""
        return options.get("provider")

    async def stream(self, request: ChatRequest, model: str) -> AsyncIterator[Event]:
        ScriptedBackend.asked.append(request)
        sent = calls = 0
        limit = request.most_completion_tokens
        for step in self._steps(request):
            if sent == limit:
                yield Finish(0, "length")
                yield self._usage(sent)
                return
            if step == "<fail>":
                raise RuntimeError("backend crashed")
            if step == "<error>":
                raise APIError("upstream refused", status=502, type="server_error", code="bad")
            if step == "<rate-limited>":
                raise self.rate_limited()
            if step == "<refuse>":
                raise APIError("the upstream refused this request", param="messages")
            if step == "<hang>":
                ScriptedBackend.hanging += 1
                try:
                    await asyncio.Event().wait()
                finally:
                    ScriptedBackend.hanging -= 1
            sent += 1
            if isinstance(step, dict):
                yield ToolCallDelta(
                    0, calls, step["arguments"], id=f"call_{calls:024}", name=step["call"]
                )
                calls += 1
            else:
                yield TextDelta(0, step)
        yield Finish(0, "tool_calls" if calls else "stop")
        yield self._usage(sent)

    def _usage(self, sent: int) -> Usage:
        return Usage(**{"prompt_tokens": 1, **self.config.options.get("usage", {})},
                     completion_tokens=sent)  # fmt: skip

    def rate_limited(self) -> UpstreamError:
        error = UpstreamError("rate limited", status=429, type="requests", code="rate_limit")
        error.retry_after = self.config.options.get("retry_after")
        return error

    def _steps(self, request: ChatRequest) -> list[Any]:
        every_tool = [{"call": tool.name, "arguments": "{}"} for tool in request.tools]
        return [
            each
            for step in self.config.options.get("script", [])
            for each in (every_tool if step == "<call every tool>" else [step])
        ]


class ScriptedEmbedder(ScriptedBackend):
    """Embeds too (kind ``scripted-embedder``): each input's vector is one number, the
    length of the backend's name; its script's ``"<error>"`` or ``"<rate-limited>"``
    fails the request as in a stream."""

    async def embed(self, request: EmbeddingsRequest, model: str) -> Embeddings:
        script = self.config.options.get("script", [])
        if "<error>" in script:
            raise APIError("upstream refused", status=502, type="server_error", code="bad")
        if "<rate-limited>" in script:
            raise self.rate_limited()
        vector = struct.pack("<f", float(len(self.config.name)))
        return Embeddings([vector] * len(request.inputs), prompt_tokens=len(request.inputs))


@dataclass(frozen=True)
class Call:
    """A turn in which the model calls function ``name`` with ``arguments``."""

    name: str
    arguments: dict[str, Any]


Turn = str | Call
"""A turn of a script: an answer in text, or a function call."""


def scripted_vector(text: str, dimensions: int) -> list[float]:
    """The scripted upstream's embedding of ``text``: the same text, the same vector,
    of length one (made of its characters' codes)."""
    numbers = [float((sum(map(ord, text)) * (i + 1)) % 97 + 1) for i in range(dimensions)]
    norm = math.sqrt(sum(x * x for x in numbers))
    return [x / norm for x in numbers]


EMBEDDING_FAULTS = {
    "count": "one vector fewer than the inputs",
    "index": "two vectors with the same index",
    "width": "vectors of different widths",
    "base64": "a vector that is not base64",
    "nan": "a vector with a NaN (in base64)",
    "html": "an HTML page with status 200",
    "stream": "an event stream",
    "usage": "usage of a billion tokens",
    "flaky": "a 503 the first time this model is asked, then the answer",
    "refuse": "a 400 in OpenAI's envelope",
    "hang-up": "the connection closed without an answer",
    "slow": "the answer after 3 seconds",
}
"""How the scripted upstream answers an embeddings request for model ``fault:<name>``."""


class ScriptedUpstream:
    """An upstream on loopback whose model plays a script, speaking OpenAI's Chat
    Completions (``/v1/chat/completions``) or Anthropic's Messages API
    (``/v1/messages``) as it is asked, its ids in each one's form: ``scripts`` maps a
    model name to its turns, and a request is answered with the turn after the
    model's earlier calls in its conversation (the last turn once the script is
    played). Streamed as asked, with
    usage; every request's body is kept in :attr:`requests`, its path and headers in
    :attr:`heads`. It embeds too (``/v1/embeddings``, :func:`scripted_vector` for each
    text, in the encoding asked), or misbehaves as :data:`EMBEDDING_FAULTS` says.
    """

    def __init__(self, scripts: dict[str, list[Turn]] | None = None) -> None:
        self.scripts = scripts or {}
        self.asked: Counter[str] = Counter()
        self.requests: list[dict[str, Any]] = []
        self.heads: list[tuple[str, dict[str, str]]] = []
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                upstream.requests.append(body)
                upstream.heads.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                stream = bool(body.get("stream"))
                if self.path.endswith("/embeddings"):
                    status, kind, payload = upstream.embeddings(body)
                    if status == 0:  # hang up without an answer
                        self.close_connection = True
                        return
                    self.send_response(status)
                    self.send_header("Content-Type", kind)
                    self.send_header("Content-Length", str(len(payload)))
                    self.send_header("Connection", "close")
                    self.end_headers()
                    with contextlib.suppress(BrokenPipeError):  # a client that gave up
                        self.wfile.write(payload)
                    return
                payload = upstream.payload(self.path, body)
                self.send_response(200)
                kind = "text/event-stream" if stream else "application/json"
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(payload)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: the tests read :attr:`requests`."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def payload(self, path: str, body: dict[str, Any]) -> bytes:
        """The body answering ``body`` on ``path``: Anthropic's named events or message
        on ``/messages``, else chat chunks or a completion."""
        stream = bool(body.get("stream"))
        if path.endswith("/messages"):
            answer = self.message(body)
            if not stream:
                return json.dumps(answer).encode()
            named = (f"event: {event['type']}\ndata: {json.dumps(event)}\n\n" for event in answer)
            return "".join(named).encode()
        answer = self.answer(body)
        if not stream:
            return json.dumps(answer).encode()
        chunks = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in answer)
        return (chunks + "data: [DONE]\n\n").encode()

    def message_usage(self, body: dict[str, Any]) -> dict[str, Any]:
        """Anthropic's usage of the message answering ``body``."""
        return {"input_tokens": 10, "output_tokens": 5}

    def delta_usage(self, usage: dict[str, Any]) -> dict[str, Any]:
        """What ``message_delta`` says of the message's ``usage``."""
        return {"output_tokens": usage["output_tokens"]}

    def chat_usage(self, body: dict[str, Any]) -> dict[str, Any]:
        """The usage of the completion answering ``body``."""
        return {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}

    def embeddings(self, body: dict[str, Any]) -> tuple[int, str, bytes]:
        """The status, content type and body answering the embeddings request ``body``."""
        model = body["model"]
        fault = model.removeprefix("fault:") if model.startswith("fault:") else ""
        self.asked[model] += 1
        inputs = body["input"]
        if isinstance(inputs, str) or (inputs and isinstance(inputs[0], int)):
            inputs = [inputs]
        texts = [text if isinstance(text, str) else " ".join(map(str, text)) for text in inputs]
        vectors = [scripted_vector(text, body.get("dimensions", 8)) for text in texts]
        if fault == "slow":
            time.sleep(3)
        if fault == "hang-up":
            return 0, "", b""
        if fault == "html":
            return 200, "text/html", b"<html>Bad gateway</html>"
        if fault == "stream":
            return 200, "text/event-stream", b"data: [DONE]\n\n"
        if fault == "refuse" or (fault == "flaky" and self.asked[model] == 1):
            status = 400 if fault == "refuse" else 503
            error = {"message": "no", "type": "invalid_request_error", "param": None, "code": None}
            return status, "application/json", json.dumps({"error": error}).encode()
        if fault == "width":
            vectors[-1] = vectors[-1][:-1]
        data = []
        for index, vector in enumerate(vectors):
            packed = struct.pack(f"<{len(vector)}f", *vector)
            if fault == "nan":
                packed = struct.pack("<f", math.nan) + packed[4:]
            encoded = (
                base64.b64encode(packed).decode()
                if body.get("encoding_format") == "base64"
                else vector
            )
            data.append({"object": "embedding", "index": index, "embedding": encoded})
        if fault == "count":
            data.pop()
        if fault == "index":
            data[-1]["index"] = 0
        if fault == "base64":
            data[0]["embedding"] = "not base64!"
        tokens = 10**9 if fault == "usage" else sum(len(text.split()) for text in texts)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        answer = {"object": "list", "data": data, "model": model, "usage": usage}
        return 200, "application/json", json.dumps(answer).encode()

    def turn(self, body: dict[str, Any]) -> Turn:
        """The turn ``body``'s conversation (in either API's messages) has come to."""
        script = self.scripts[body["model"]]
        played = sum(1 for message in body["messages"] if _called(message))
        return script[min(played, len(script) - 1)]

    def message(self, body: dict[str, Any]) -> Any:
        """Anthropic's events (streamed) or message for the turn ``body`` is at."""
        turn = self.turn(body)
        if isinstance(turn, Call):
            use = {"type": "tool_use", "id": f"toolu_{len(self.requests):024}", "name": turn.name}
            blocks, stop = [{**use, "input": turn.arguments}], "tool_use"
        else:
            blocks, stop = [{"type": "text", "text": turn}], "end_turn"
        usage = self.message_usage(body)
        message = {"id": "msg_scripted", "type": "message", "role": "assistant",
                   "model": body["model"], "stop_reason": stop, "stop_sequence": None}  # fmt: skip
        if not body.get("stream"):
            return {**message, "content": blocks, "usage": usage}
        start = {
            **message,
            "content": [],
            "stop_reason": None,
            "usage": {**usage, "output_tokens": 1},
        }
        block = blocks[0]
        if isinstance(turn, Call):
            opened = {**use, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(turn.arguments)}
        else:
            opened = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        return [
            {"type": "message_start", "message": start},
            {"type": "content_block_start", "index": 0, "content_block": opened},
            {"type": "ping"},
            {"type": "content_block_delta", "index": 0, "delta": delta},
            {"type": "content_block_stop", "index": 0},
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": self.delta_usage(usage),
            },
            {"type": "message_stop"},
        ]

    def answer(self, body: dict[str, Any]) -> Any:
        """The chunks (streamed) or the completion of the turn ``body`` is at."""
        turn = self.turn(body)
        if isinstance(turn, Call):
            function = {"name": turn.name, "arguments": json.dumps(turn.arguments)}
            call = {
                "id": f"call_{len(self.requests):024}",
                "type": "function",
                "function": function,
            }
            message, finish = {"content": None, "tool_calls": [call]}, "tool_calls"
        else:
            message, finish = {"content": turn}, "stop"
        usage = self.chat_usage(body)
        head = {"id": "chatcmpl-scripted", "created": 1, "model": body["model"]}
        if not body.get("stream"):
            choice = {"index": 0, "message": {"role": "assistant", **message}}
            return {**head, "object": "chat.completion", "usage": usage,
                    "choices": [{**choice, "finish_reason": finish}]}  # fmt: skip
        if isinstance(turn, Call):
            message["tool_calls"][0]["index"] = 0
        chunk = {**head, "object": "chat.completion.chunk"}
        return [
            {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", **message}}]},
            {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
            {**chunk, "choices": [], "usage": usage},
        ]


def _called(message: dict[str, Any]) -> bool:
    """Whether a chat message or an Anthropic turn holds the model's calls."""
    if message.get("tool_calls"):
        return True
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(block, dict) and block.get("type") == "tool_use" for block in content
    )


class WithScriptedUpstream:
    """Mixed into a test case (before it): a :class:`ScriptedUpstream` of the class's own,
    ``cls.upstream``, closed after its tests."""

    upstream: ScriptedUpstream
    upstream_scripts: dict[str, list[Turn]] = {}
    """Its models' scripts (:class:`ScriptedUpstream`)."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.upstream = ScriptedUpstream(cls.upstream_scripts)
        super().setUpClass()  # type: ignore[misc]
        cls.addClassCleanup(cls.upstream.close)  # type: ignore[attr-defined]
