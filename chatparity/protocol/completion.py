"""A stream of chunks -> the ``chat.completion`` OpenAI returns for ``stream: false``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Choice:
    content: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    function_call: dict[str, Any] | None = None  # the deprecated shape: {name, arguments}
    logprobs: list[dict[str, Any]] | None = None
    finish_reason: str | None = None


class CompletionAccumulator:
    """Folds ``chat.completion.chunk`` objects into one ``chat.completion``.

    Non-stream responses are built by feeding this the very chunks a stream
    would carry, so the two can never disagree.
    """

    def __init__(self) -> None:
        self._envelope: dict[str, Any] = {}
        self._choices: dict[int, _Choice] = {}
        self._usage: dict[str, Any] | None = None

    def add(self, chunk: dict[str, Any]) -> None:
        if not self._envelope:
            self._envelope = {
                key: chunk.get(key)
                for key in ("id", "created", "model", "service_tier", "system_fingerprint")
            }
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices", ()):
            self._add_choice(choice)

    def _add_choice(self, choice: dict[str, Any]) -> None:
        state = self._choices.setdefault(choice["index"], _Choice())
        delta = choice.get("delta") or {}
        if delta.get("content"):
            state.content.append(delta["content"])
        for call in delta.get("tool_calls") or ():
            slot = state.tool_calls.setdefault(
                call["index"], {"id": None, "type": "function", "name": "", "arguments": []}
            )
            if call.get("id"):
                slot["id"] = call["id"]
            function = call.get("function") or {}
            if function.get("name"):
                slot["name"] = function["name"]
            if function.get("arguments"):
                slot["arguments"].append(function["arguments"])
        if "function_call" in delta:
            called = delta["function_call"]
            if state.function_call is None:
                state.function_call = {"name": called.get("name") or "", "arguments": []}
            if called.get("arguments"):
                state.function_call["arguments"].append(called["arguments"])
        if choice.get("logprobs") is not None:
            state.logprobs = (state.logprobs or []) + list(choice["logprobs"].get("content") or [])
        if choice.get("finish_reason"):
            state.finish_reason = choice["finish_reason"]

    def completion(self) -> dict[str, Any]:
        choices = []
        for index in sorted(self._choices):
            state = self._choices[index]
            called = state.tool_calls or state.function_call is not None
            message: dict[str, Any] = {
                "role": "assistant",
                "content": "".join(state.content) if state.content or not called else None,
            }
            if state.function_call is not None:
                message["function_call"] = {
                    "name": state.function_call["name"],
                    "arguments": "".join(state.function_call["arguments"]),
                }
            if state.tool_calls:
                message["tool_calls"] = [
                    {
                        "id": slot["id"],
                        "type": slot["type"],
                        "function": {"name": slot["name"], "arguments": "".join(slot["arguments"])},
                    }
                    for _, slot in sorted(state.tool_calls.items())
                ]
            message |= {"refusal": None, "annotations": []}
            choices.append(
                {
                    "index": index,
                    "message": message,
                    "logprobs": None
                    if state.logprobs is None
                    else {"content": state.logprobs, "refusal": None},
                    "finish_reason": state.finish_reason,
                }
            )
        envelope = self._envelope
        return {
            "id": envelope.get("id"),
            "object": "chat.completion",
            "created": envelope.get("created"),
            "model": envelope.get("model"),
            "choices": choices,
            "usage": self._usage,
            "service_tier": envelope.get("service_tier"),
            "system_fingerprint": envelope.get("system_fingerprint"),
        }
