"""Upstreams on loopback that cache prompts as the providers do, and report it as they do.

:class:`CachingUpstream` is a :class:`~tests.scripted.ScriptedUpstream` whose
usage is what a provider's prompt cache makes of each request:

- On Anthropic's Messages API, prefix caching up to each breakpoint: the prompt
  is its blocks in Anthropic's order (tools, system, messages); a ``cache_control``
  marker (or the request's own, on its last block) writes the prefix up to its
  block for its ``ttl`` (5m unless 1h), and a request reads the longest prefix
  cached at a block boundary up to :data:`LOOKBACK` blocks before one of its
  breakpoints. Usage as Anthropic reports it: ``input_tokens`` past the cache,
  ``cache_read_input_tokens``, ``cache_creation_input_tokens`` and
  ``cache_creation`` by lifetime, in ``message_start`` and (cumulative)
  ``message_delta``.
- On OpenAI's Chat Completions and Responses APIs, prefix caching by message (or
  input item) among the requests of one ``prompt_cache_key``: requests without
  one are routed anywhere and read nothing. Usage reports
  ``prompt_tokens_details.cached_tokens`` (``input_tokens_details`` on the
  Responses API).

A text's tokens are its characters over four, whatever the API writes around it,
so that the same conversation costs the same on each. Every request's body is in
:attr:`requests`, every usage reported in :attr:`reported`. A model named in
``scripts`` plays its script; any other plays an agent: a call of ``Read`` when the
conversation ends with the user's words, a text answer when it ends with a tool's
result.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tests.scripted import Call, ScriptedUpstream, Turn

LOOKBACK = 20
"""How many blocks before a breakpoint Anthropic looks for a cached prefix."""
TTL_SECONDS = {"5m": 300, "1h": 3600}
OUTPUT_TOKENS = 5


def tokens(text: str) -> int:
    """The tokens the stub counts for ``text``."""
    return math.ceil(len(text) / 4)


@dataclass(frozen=True)
class Block:
    """A piece of the prompt: what the cache keys it by, its tokens, its marker."""

    key: str
    tokens: int
    marker: dict[str, Any] | None = None


def _digest(previous: str, key: str) -> str:
    return hashlib.sha256(f"{previous}\x00{key}".encode()).hexdigest()


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def anthropic_blocks(body: dict[str, Any]) -> list[Block]:
    """A Messages request's prompt as blocks, in the order Anthropic caches it."""
    blocks = [
        Block(
            "tool:" + _canonical({k: v for k, v in tool.items() if k != "cache_control"}),
            tokens(_canonical(tool.get("input_schema"))) + tokens(tool.get("description") or ""),
            tool.get("cache_control"),
        )
        for tool in body.get("tools") or ()
    ]
    system = body.get("system") or []
    for block in [{"type": "text", "text": system}] if isinstance(system, str) else system:
        blocks.append(
            Block("system:" + block["text"], tokens(block["text"]), block.get("cache_control"))
        )
    for turn in body["messages"]:
        content = turn["content"]
        for block in [{"type": "text", "text": content}] if isinstance(content, str) else content:
            unmarked = {k: v for k, v in block.items() if k != "cache_control"}
            blocks.append(
                Block(
                    f"{turn['role']}:{_canonical(unmarked)}",
                    tokens(_block_text(block)),
                    block.get("cache_control"),
                )
            )
    return blocks


def _block_text(block: dict[str, Any]) -> str:
    kind = block["type"]
    if kind == "text":
        return block["text"]
    if kind == "tool_use":
        return block["name"] + _canonical(block["input"])
    if kind == "tool_result":
        content = block.get("content") or ""
        return content if isinstance(content, str) else "".join(p["text"] for p in content)
    return ""


class PromptCache:
    """Anthropic's prompt cache: prefixes (their digests) and when each expires."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.entries: dict[str, float] = {}

    def usage(self, blocks: list[Block], automatic: dict[str, Any] | None) -> dict[str, Any]:
        """What one request reads and writes, as Anthropic reports it."""
        now = self.clock()
        digests, totals = [], []
        digest, total = "", 0
        for block in blocks:
            digest, total = _digest(digest, block.key), total + block.tokens
            digests.append(digest)
            totals.append(total)
        breakpoints = [(i, block.marker) for i, block in enumerate(blocks) if block.marker]
        if automatic is not None and blocks and blocks[-1].marker is None:
            breakpoints.append((len(blocks) - 1, automatic))
        read_to = -1
        for at, _ in breakpoints:
            for i in range(at, max(at - LOOKBACK, 0) - 1, -1):
                if self.entries.get(digests[i], 0) > now:
                    read_to = max(read_to, i)
                    break
        written = {"5m": 0, "1h": 0}
        done = read_to
        for at, marker in breakpoints:
            ttl = marker.get("ttl") or "5m"
            if at > done:
                written[ttl] += totals[at] - (totals[done] if done >= 0 else 0)
                done = at
            self.entries[digests[at]] = max(
                self.entries.get(digests[at], 0), now + TTL_SECONDS[ttl]
            )
        read = totals[read_to] if read_to >= 0 else 0
        prompt = totals[-1] if totals else 0
        return {
            "input_tokens": prompt - read - written["5m"] - written["1h"],
            "cache_creation_input_tokens": written["5m"] + written["1h"],
            "cache_read_input_tokens": read,
            "cache_creation": {
                "ephemeral_5m_input_tokens": written["5m"],
                "ephemeral_1h_input_tokens": written["1h"],
            },
            "output_tokens": OUTPUT_TOKENS,
        }


def openai_segments(body: dict[str, Any]) -> list[Block]:
    """A Chat Completions or Responses request's prompt, a segment a message or item."""
    offered = "".join(map(_tool_text, body.get("tools") or ()))
    segments = [Block("tools:" + offered, tokens(offered))] if offered else []
    if body.get("instructions"):
        segments.append(Block("system:" + body["instructions"], tokens(body["instructions"])))
    items = body["messages"] if "messages" in body else body["input"]
    for item in [{"role": "user", "content": items}] if isinstance(items, str) else items:
        text = _item_text(item)
        segments.append(Block(f"{item.get('role', item.get('type'))}:{text}", tokens(text)))
    return segments


def _tool_text(tool: dict[str, Any]) -> str:
    """A function's name, description and parameters, in either API's shape."""
    function = tool.get("function", tool)
    return (
        function["name"]
        + (function.get("description") or "")
        + _canonical(function.get("parameters"))
    )


def _item_text(item: dict[str, Any]) -> str:
    """The words of a chat message or a Responses item."""
    parts = []
    content = item.get("content")
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        parts += [part.get("text", "") for part in content]
    for call in item.get("tool_calls") or ():
        parts.append(call["function"]["name"] + call["function"]["arguments"])
    if item.get("type") == "function_call":
        parts.append(item["name"] + item["arguments"])
    if item.get("type") == "function_call_output":
        parts.append(item["output"] if isinstance(item["output"], str) else "")
    return "".join(parts)


class CachingUpstream(ScriptedUpstream):
    """A :class:`~tests.scripted.ScriptedUpstream` whose usage is its prompt cache's
    (see the module's docstring); it also speaks the Responses API."""

    def __init__(
        self,
        scripts: dict[str, list[Turn]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cache = PromptCache(clock)
        self.prefixes: dict[str, set[str]] = {}  # prompt_cache_key -> prefixes seen
        self.reported: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        super().__init__(scripts)

    def turn(self, body: dict[str, Any]) -> Turn:
        if body["model"] in self.scripts:
            return super().turn(body)
        items = body["messages"] if "messages" in body else body["input"]
        if _ends_with_a_result(items[-1]):
            return f"Done with step {len(items)}: the file reads as expected."
        return Call("Read", {"file_path": f"src/module_{len(items)}.py"})

    def message_usage(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            usage = self.cache.usage(anthropic_blocks(body), body.get("cache_control"))
            self.reported.append(usage)
        return usage

    def delta_usage(self, usage: dict[str, Any]) -> dict[str, Any]:
        """Anthropic's ``message_delta``: the cumulative counts, without the lifetimes."""
        return {key: value for key, value in usage.items() if key != "cache_creation"}

    def chat_usage(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt, cached = self._openai_cache(body)
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": OUTPUT_TOKENS,
            "total_tokens": prompt + OUTPUT_TOKENS,
            "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
        }
        self.reported.append(usage)
        return usage

    def _openai_cache(self, body: dict[str, Any]) -> tuple[int, int]:
        """The prompt's tokens and those read from the cache of its ``prompt_cache_key``."""
        segments = openai_segments(body)
        key = body.get("prompt_cache_key")
        with self._lock:
            seen = self.prefixes.setdefault(key, set()) if key else set()
            digest, total, cached = "", 0, 0
            for segment in segments:
                digest, total = _digest(digest, segment.key), total + segment.tokens
                if digest in seen:
                    cached = total
                seen.add(digest)
        # The last segment is never all read: the model reads something new.
        return total, min(cached, total - segments[-1].tokens) if segments else 0

    def payload(self, path: str, body: dict[str, Any]) -> bytes:
        if not path.endswith("/responses"):
            return super().payload(path, body)
        response = self.response(body)
        if not body.get("stream"):
            return json.dumps(response).encode()
        events = [
            {
                "type": "response.created",
                "response": {**response, "status": "in_progress", "output": [], "usage": None},
            },
            *(
                {"type": "response.output_item.done", "output_index": i, "item": item}
                for i, item in enumerate(response["output"])
            ),
            {"type": "response.completed", "response": response},
        ]
        return "".join(
            f"event: {event['type']}\ndata: {json.dumps(event)}\n\n" for event in events
        ).encode()

    def response(self, body: dict[str, Any]) -> dict[str, Any]:
        """The Responses API's response to ``body``, with its usage."""
        turn = self.turn(body)
        number = len(self.requests)
        if isinstance(turn, Call):
            item = {
                "type": "function_call",
                "id": f"fc_{number}",
                "call_id": f"call_{number:024}",
                "name": turn.name,
                "arguments": json.dumps(turn.arguments),
                "status": "completed",
            }
        else:
            text = {"type": "output_text", "text": turn, "annotations": []}
            item = {
                "type": "message",
                "id": f"msg_{number}",
                "role": "assistant",
                "status": "completed",
                "content": [text],
            }
        prompt, cached = self._openai_cache(body)
        usage = {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": OUTPUT_TOKENS,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + OUTPUT_TOKENS,
        }
        self.reported.append(usage)
        return {
            "id": f"resp_{number}",
            "object": "response",
            "created_at": 1,
            "status": "completed",
            "model": body["model"],
            "output": [item],
            "usage": usage,
        }


def _ends_with_a_result(item: dict[str, Any]) -> bool:
    """Whether a conversation's last message (or item) holds a tool's result."""
    if item.get("role") == "tool" or item.get("type") == "function_call_output":
        return True
    content = item.get("content")
    return isinstance(content, list) and any(
        isinstance(block, dict) and block.get("type") == "tool_result" for block in content
    )


def markers(body: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every cache marker of a Messages request and where it is, in Anthropic's order."""
    for i, tool in enumerate(body.get("tools") or ()):
        if "cache_control" in tool:
            yield f"tools.{i}", tool["cache_control"]
    system = body.get("system")
    for i, block in enumerate(system if isinstance(system, list) else ()):
        if "cache_control" in block:
            yield f"system.{i}", block["cache_control"]
    for i, turn in enumerate(body["messages"]):
        content = turn["content"]
        for j, block in enumerate(content if isinstance(content, list) else ()):
            if "cache_control" in block:
                yield f"messages.{i}.content.{j}", block["cache_control"]
    if "cache_control" in body:
        yield "cache_control", body["cache_control"]
