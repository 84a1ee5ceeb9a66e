"""The Chat Completions request: OpenAI's schema, validated with OpenAI's errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .errors import APIError

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


@dataclass(frozen=True, slots=True)
class Message:
    """One entry of ``messages``; array content is flattened to its text."""

    role: Role
    content: str | None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool = False


@dataclass(frozen=True, slots=True)
class ToolChoice:
    mode: Literal["none", "auto", "required", "function"]
    name: str | None = None


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    type: Literal["text", "json_object", "json_schema"]
    schema: dict[str, Any] | None = None
    name: str | None = None
    strict: bool = False


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A validated request. ``body`` keeps the JSON object exactly as sent."""

    model: str
    messages: list[Message]
    body: dict[str, Any]
    stream: bool = False
    include_usage: bool = False
    n: int = 1
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    logprobs: bool = False
    top_logprobs: int = 0
    response_format: ResponseFormat | None = None
    tools: list[Tool] = field(default_factory=list)
    tool_choice: ToolChoice = ToolChoice("none")
    parallel_tool_calls: bool = True
    reasoning_effort: str | None = None
    service_tier: str | None = None
    user: str | None = None


def parse_chat_request(body: Any) -> ChatRequest:
    """Validate a decoded JSON body; raise :class:`APIError` as OpenAI would."""
    raise APIError("not implemented")
