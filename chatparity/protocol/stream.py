"""Backend events -> ``chat.completion.chunk`` objects and SSE frames."""

from __future__ import annotations

from typing import Any

import orjson

from .enums import ServiceTier
from .errors import APIError
from .events import Event, Finish, ReasoningDelta, TextDelta, TokenLogprob, ToolCallDelta, Usage

DONE = b"data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> bytes:
    """One server-sent event carrying ``payload`` as compact JSON."""
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def error_frame(error: APIError) -> bytes:
    """The frame sent when an error happens after streaming began."""
    return sse(error.envelope())


def usage_object(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": usage.reasoning_tokens,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def logprobs_object(entries: list[TokenLogprob]) -> dict[str, Any]:
    return {
        "content": [
            {
                "token": entry.token,
                "logprob": entry.logprob,
                "bytes": entry.bytes,
                "top_logprobs": [
                    {"token": top.token, "logprob": top.logprob, "bytes": top.bytes}
                    for top in entry.top_logprobs
                ],
            }
            for entry in entries
        ],
        "refusal": None,
    }


class ChunkEncoder:
    """Turns one request's backend events into OpenAI's chunk objects.

    It supplies what backends leave implicit: the role chunk that opens every
    choice, the shared envelope fields, ``usage: null`` on every chunk when the
    client asked for usage, and the ``choices: []`` usage chunk at the end.
    With ``legacy_functions`` (the client sent the deprecated ``functions``) a
    choice's call is sent as ``function_call`` deltas and finishes with
    ``function_call``, as OpenAI answers them.
    """

    def __init__(
        self,
        *,
        completion_id: str,
        created: int,
        model: str,
        system_fingerprint: str,
        include_usage: bool = False,
        logprobs: bool = False,
        service_tier: ServiceTier = "default",
        legacy_functions: bool = False,
    ) -> None:
        self.include_usage = include_usage
        self.logprobs = logprobs
        self.legacy_functions = legacy_functions
        self._envelope: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "service_tier": service_tier,
            "system_fingerprint": system_fingerprint,
        }
        self._opened: set[int] = set()

    def encode(self, event: Event) -> list[dict[str, Any]]:
        """The chunks for one event, opening its choice first if needed."""
        if isinstance(event, Usage):
            return [self.usage_chunk(event)] if self.include_usage else []
        if isinstance(event, ReasoningDelta):
            return []  # OpenAI's chat completions show no reasoning
        chunks: list[dict[str, Any]] = []
        opening = event.index not in self._opened
        self._opened.add(event.index)
        if isinstance(event, ToolCallDelta):
            return self._call_chunks(event, opening)
        if opening:
            chunks.append(self._role_chunk(event.index))
        if isinstance(event, Finish):
            reason = event.reason
            if reason == "tool_calls" and self.legacy_functions:
                reason = "function_call"
            chunks.append(self._chunk(event.index, {}, finish_reason=reason))
        elif isinstance(event, TextDelta):
            logprobs = logprobs_object(event.logprobs) if event.logprobs is not None else None
            chunks.append(self._chunk(event.index, {"content": event.text}, logprobs=logprobs))
        return chunks

    def _call_chunks(self, event: ToolCallDelta, opening: bool) -> list[dict[str, Any]]:
        """A call's first delta carries its name and empty arguments (and, in a tool
        call, its index, id and type), later ones argument fragments. The deprecated
        ``function_call`` carries a choice's first call only."""
        legacy = self.legacy_functions
        if legacy and event.call_index:
            return []
        chunks: list[dict[str, Any]] = []
        if event.id is not None:
            function = {"name": event.name, "arguments": ""}
            delta: dict[str, Any] = (
                {"function_call": function}
                if legacy
                else {
                    "tool_calls": [
                        {"index": event.call_index, "id": event.id, "type": "function",
                         "function": function}
                    ]
                }
            )  # fmt: skip
            if opening:
                delta = {"role": "assistant", "content": None, **delta, "refusal": None}
            chunks.append(self._chunk(event.index, delta))
            if not event.arguments:
                return chunks
        fragment = {"arguments": event.arguments}
        delta = (
            {"function_call": fragment}
            if legacy
            else {"tool_calls": [{"index": event.call_index, "function": fragment}]}
        )
        chunks.append(self._chunk(event.index, delta))
        return chunks

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        return {**self._envelope, "choices": [], "usage": usage_object(usage)}

    def _role_chunk(self, index: int) -> dict[str, Any]:
        delta = {"role": "assistant", "content": "", "refusal": None}
        logprobs: dict[str, Any] | None = (
            {"content": [], "refusal": None} if self.logprobs else None
        )
        return self._chunk(index, delta, logprobs=logprobs)

    def _chunk(
        self,
        index: int,
        delta: dict[str, Any],
        *,
        logprobs: dict[str, Any] | None = None,
        finish_reason: str | None = None,
    ) -> dict[str, Any]:
        choice = {
            "index": index,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }
        chunk = {**self._envelope, "choices": [choice]}
        if self.include_usage:
            chunk["usage"] = None
        return chunk
