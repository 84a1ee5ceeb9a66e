"""Scripted coding-agent sessions: the requests an agent sends turn after turn, growing,
with the cache markers or key it sends, over any transport.

A session is one of :class:`ClaudeCodeSession` (Anthropic's Messages API, as Claude
Code writes it: system blocks marked for an hour, the last user turn marked for
five minutes, the marker moving on each turn), :class:`CodexSession` (the Responses
API, as Codex writes it: its instructions, the whole input each turn, a
``prompt_cache_key``) or :class:`ChatSession` (Chat Completions with markers on
parts, as OpenRouter's clients write them). :func:`run` plays ``turns`` of one
through ``post`` (the stub's own HTTP, or chatparity's) and gives each
:class:`Exchange`: what was sent and the answer read back, with its usage in its
wire's names. The upstream answers as an agent's model: a call of ``Read`` after
the user's words, text after a tool's result (see :mod:`tests.support.prompt_cache`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

Post = Callable[[str, dict[str, Any]], Awaitable[tuple[int, str, bytes]]]
"""Sends a body to a path (``/v1/messages``, ...): the status, content type and body."""

INSTRUCTIONS = " ".join(
    f"Rule {n}: read the code before changing it, keep each change small, run the tests"
    f" that cover it, and say what was done and why (guideline {n} of the house style)."
    for n in range(300)
)
"""An agent's long, unchanging instructions (about 9,000 tokens)."""
REMINDER = (
    "<system-reminder>\nThe project uses Python 3.11; tests run with pytest.\n</system-reminder>"
)
FILE = "def handler(request):\n    return respond(request)  # unchanged since last week\n" * 30
TOOLS = [
    {
        "name": name,
        "description": f"{name}: one of the agent's tools. " + "It takes care. " * 40,
        "input_schema": {
            "type": "object",
            "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["file_path"],
        },
    }
    for name in ("Read", "Write", "Edit", "Bash", "Glob", "Grep", "LS", "WebFetch")
]
HOUR = {"type": "ephemeral", "ttl": "1h"}
FIVE_MINUTES = {"type": "ephemeral"}


def prompt(n: int) -> str:
    return f"Step {n}: look at module {n} and tell me whether it needs a change."


@dataclass
class Exchange:
    """One turn: the body sent, the answer read back and the usage it reported."""

    sent: dict[str, Any]
    answer: dict[str, Any]
    usage: dict[str, Any]


@dataclass
class ClaudeCodeSession:
    """Claude Code's requests on ``/v1/messages`` to ``model``."""

    model: str
    path: str = "/v1/messages"
    messages: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": REMINDER},
                    {"type": "text", "text": prompt(0)},
                ],
            }
        )

    def request(self, stream: bool) -> dict[str, Any]:
        messages = json.loads(json.dumps(self.messages))
        messages[-1]["content"][-1]["cache_control"] = FIVE_MINUTES  # the marker moves on
        return {
            "model": self.model,
            "max_tokens": 32000,
            "system": [
                {"type": "text", "text": "You are Claude Code.", "cache_control": HOUR},
                {"type": "text", "text": INSTRUCTIONS, "cache_control": HOUR},
            ],
            "messages": messages,
            "tools": TOOLS,
            "metadata": {"user_id": "user_session_0"},
            "temperature": 1,
            "stream": stream,
        }

    def answered(self, message: dict[str, Any]) -> None:
        content = [block for block in message["content"] if block["type"] != "thinking"]
        self.messages.append({"role": "assistant", "content": content})
        uses = [block for block in content if block["type"] == "tool_use"]
        turn = [{"type": "tool_result", "tool_use_id": use["id"], "content": FILE} for use in uses]
        self.messages.append(
            {
                "role": "user",
                "content": turn or [{"type": "text", "text": prompt(len(self.messages))}],
            }
        )

    @staticmethod
    def read(kind: str, raw: bytes) -> dict[str, Any]:
        """The message a stream adds up to, as Anthropic's SDKs add it up (the counts of
        ``message_delta``, the cache's lifetimes of ``message_start``), or the message."""
        if not kind.startswith("text/event-stream"):
            return json.loads(raw)
        message: dict[str, Any] = {}
        for event in _events(raw):
            if event["type"] == "message_start":
                message = event["message"]
            elif event["type"] == "content_block_start":
                message["content"].append(event["content_block"])
            elif event["type"] == "content_block_delta":
                block, delta = message["content"][event["index"]], event["delta"]
                if delta["type"] == "text_delta":
                    block["text"] += delta["text"]
                elif delta["type"] == "input_json_delta":
                    block["partial"] = block.get("partial", "") + delta["partial_json"]
            elif event["type"] == "message_delta":
                message.update(event["delta"])
                counts = {k: v for k, v in event["usage"].items() if k != "cache_creation"}
                message["usage"].update(counts)
        for block in message["content"]:
            if "partial" in block:
                block["input"] = json.loads(block.pop("partial"))
        return message


@dataclass
class CodexSession:
    """Codex's requests on ``/v1/responses`` to ``model``: the whole input each turn, not
    stored, under its session's ``prompt_cache_key``."""

    model: str
    path: str = "/v1/responses"
    input: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.input.append(_user_item(prompt(0)))

    def request(self, stream: bool) -> dict[str, Any]:
        return {
            "model": self.model,
            "instructions": INSTRUCTIONS,
            "input": list(self.input),
            "tools": [
                {
                    "type": "function",
                    "name": tool["name"],
                    "description": tool["description"],
                    "parameters": tool["input_schema"],
                    "strict": False,
                }
                for tool in TOOLS
            ],
            "tool_choice": "auto",
            "parallel_tool_calls": False,
            "store": False,
            "stream": stream,
            "prompt_cache_key": "codex-session-0",
        }

    def answered(self, response: dict[str, Any]) -> None:
        for item in response["output"]:
            if item["type"] == "function_call":
                self.input.append(
                    {key: item[key] for key in ("type", "call_id", "name", "arguments")}
                )
                self.input.append(
                    {"type": "function_call_output", "call_id": item["call_id"], "output": FILE}
                )
            elif item["type"] == "message":
                text = "".join(part["text"] for part in item["content"])
                self.input.append(
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": text}],
                    }
                )
        if self.input[-1]["type"] != "function_call_output":
            self.input.append(_user_item(prompt(len(self.input))))

    @staticmethod
    def read(kind: str, raw: bytes) -> dict[str, Any]:
        """The response a stream ends with, or the response."""
        if not kind.startswith("text/event-stream"):
            return json.loads(raw)
        return next(e for e in _events(raw) if e["type"] == "response.completed")["response"]


def _user_item(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


@dataclass
class ChatSession:
    """A chat client's requests on ``/v1/chat/completions`` to ``model``, its markers on
    the system prompt and the last message's part (OpenRouter's form)."""

    model: str
    path: str = "/v1/chat/completions"
    messages: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.messages.append({"role": "user", "content": prompt(0)})

    def request(self, stream: bool) -> dict[str, Any]:
        last = self.messages[-1]
        marked = {
            **last,
            "content": [{"type": "text", "text": last["content"], "cache_control": FIVE_MINUTES}],
        }
        system = [{"type": "text", "text": INSTRUCTIONS, "cache_control": HOUR}]
        body = {
            "model": self.model,
            "messages": [{"role": "system", "content": system}, *self.messages[:-1], marked],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": t["name"],
                        "description": t["description"],
                        "parameters": t["input_schema"],
                    },
                }
                for t in TOOLS
            ],
            "stream": stream,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def answered(self, completion: dict[str, Any]) -> None:
        message = completion["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        self.messages.append(
            {"role": "assistant", "content": message.get("content"), "tool_calls": calls}
            if calls
            else {"role": "assistant", "content": message["content"]}
        )
        self.messages += [{"role": "tool", "tool_call_id": c["id"], "content": FILE} for c in calls]
        if not calls:
            self.messages.append({"role": "user", "content": prompt(len(self.messages))})

    @staticmethod
    def read(kind: str, raw: bytes) -> dict[str, Any]:
        """The completion a stream adds up to (its text, its calls, its usage)."""
        if not kind.startswith("text/event-stream"):
            return json.loads(raw)
        message: dict[str, Any] = {"role": "assistant", "content": None}
        usage = None
        for chunk in _events(raw):
            usage = chunk.get("usage") or usage
            for choice in chunk["choices"]:
                delta = choice["delta"]
                if delta.get("content"):
                    message["content"] = (message["content"] or "") + delta["content"]
                for call in delta.get("tool_calls") or ():
                    calls = message.setdefault("tool_calls", [])
                    if call["index"] == len(calls):
                        calls.append(
                            {
                                "id": call["id"],
                                "type": "function",
                                "function": {"name": call["function"]["name"], "arguments": ""},
                            }
                        )
                    calls[call["index"]]["function"]["arguments"] += call["function"]["arguments"]
        return {"choices": [{"index": 0, "message": message}], "usage": usage}


Session = ClaudeCodeSession | CodexSession | ChatSession


def _events(raw: bytes) -> list[dict[str, Any]]:
    """The JSON payloads of an event stream."""
    return [
        json.loads(line[len(b"data: ") :])
        for line in raw.split(b"\n")
        if line.startswith(b"data: ") and line != b"data: [DONE]"
    ]


async def run(session: Session, post: Post, turns: int) -> list[Exchange]:
    """``turns`` of ``session`` through ``post``, streamed every other turn."""
    exchanges = []
    for turn in range(turns):
        body = session.request(stream=turn % 2 == 0)
        status, kind, raw = await post(session.path, body)
        assert status == 200, raw
        answer = session.read(kind, raw)
        session.answered(answer)  # type: ignore[arg-type]
        exchanges.append(Exchange(body, answer, answer["usage"]))
    return exchanges


def direct(base_url: str) -> Post:
    """Posting straight to an upstream at ``base_url`` (``http://host:port``)."""

    async def post(path: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
            response = await client.post(path, json=body)
        return response.status_code, response.headers.get("content-type", ""), response.content

    return post


def through(async_client: Any, key: str) -> Post:
    """Posting to chatparity with Django's async test client, as ``key``."""

    async def post(path: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
        response = await async_client.post(
            path,
            data=json.dumps(body),
            content_type="application/json",
            headers={"Authorization": f"Bearer {key}"},
        )
        if response.streaming:
            raw = b"".join([part async for part in response.streaming_content])
        else:
            raw = response.content
        return response.status_code, response["Content-Type"], raw

    return post


def read_share(usages: list[dict[str, Any]]) -> float:
    """The share of the input read from the cache, over ``usages`` in any provider's names."""
    read = prompt = 0
    for usage in usages:
        if "cache_read_input_tokens" in usage:  # Anthropic's: input_tokens leaves it out
            read += usage["cache_read_input_tokens"]
            prompt += (
                usage["input_tokens"]
                + usage["cache_read_input_tokens"]
                + usage["cache_creation_input_tokens"]
            )
        elif "prompt_tokens" in usage:
            read += usage["prompt_tokens_details"]["cached_tokens"]
            prompt += usage["prompt_tokens"]
        else:
            read += usage["input_tokens_details"]["cached_tokens"]
            prompt += usage["input_tokens"]
    return read / prompt
