"""Anthropic's cache breakpoints in a chat request: whether it carries any, and those an
alias adds to one that carries none.

A breakpoint is a ``cache_control`` marker (``{"type": "ephemeral"}``, with a
``ttl`` of ``5m`` or ``1h``): on a text part of a message, a call, a tool, or the
request itself (Anthropic's automatic caching). A Messages upstream caches the
prompt, in the order tools, system, messages, up to each; a request may carry
:data:`MAX_BREAKPOINTS`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .request import ChatRequest, Message, TextPart

MAX_BREAKPOINTS = 4
"""The most cache markers Anthropic takes in one request."""
EPHEMERAL: dict[str, Any] = {"type": "ephemeral"}
"""The marker a breakpoint is set with: Anthropic's default lifetime, 5 minutes."""


def _message_marked(message: Message) -> bool:
    return any(part.cache_control for part in message.parts) or any(
        call.get("cache_control") for call in message.tool_calls or ()
    )


def cache_marked(request: ChatRequest) -> bool:
    """Whether ``request`` carries a cache marker anywhere."""
    return (
        request.cache_control is not None
        or any(tool.cache_control for tool in request.tools)
        or any(_message_marked(message) for message in request.messages)
    )


def with_breakpoints(request: ChatRequest) -> ChatRequest:
    """``request`` with breakpoints where a coding agent's prompt stops changing: after
    its tools, its system prompt and its last user turn (the last user message or tool
    result); ``request`` itself when it carries a marker of its own."""
    if cache_marked(request):
        return request
    tools = list(request.tools)
    if tools:
        tools[-1] = dataclasses.replace(tools[-1], cache_control=EPHEMERAL)
    messages = list(request.messages)
    for roles in (("system", "developer"), ("user", "tool", "function")):
        for index in range(len(messages) - 1, -1, -1):
            marked = _marked(messages[index]) if messages[index].role in roles else None
            if marked is not None:
                messages[index] = marked
                break
    return dataclasses.replace(request, tools=tools, messages=messages)


def _marked(message: Message) -> Message | None:
    """``message`` with a marker on its last part of text (any part of a tool result, whose
    block carries it); None if it has no such part."""
    parts = message.parts or (TextPart(message.content or ""),)
    for index in range(len(parts) - 1, -1, -1):
        if message.role == "tool" or (parts[index].text and not parts[index].text.isspace()):
            marked = dataclasses.replace(parts[index], cache_control=EPHEMERAL)
            return dataclasses.replace(message, parts=(*parts[:index], marked, *parts[index + 1 :]))
    return None
