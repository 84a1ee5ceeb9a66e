"""Token counts for backends that report none, and the bound a prompt cannot pass."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import orjson

from .request import ChatRequest, Message

CHARS_PER_TOKEN = 4
"""OpenAI's rule of thumb for English text."""

MESSAGE_TOKENS = 16
"""The most tokens a chat template adds around one message besides its text: its role
and markers (OpenAI counts 3 and the role, ChatML and Llama 3 write 4 and the role),
Qwen's ``<tool_response>`` tags around a tool's result (12), with room to spare."""
REQUEST_TOKENS = 32
"""The most tokens a template adds to a request besides its messages: the reply's
opening (3 to 5) and a default system prompt written in when the request has none
(SmolLM2's, Qwen 2.5's and Llama 3.1's are each under 30)."""
TOOLS_TOKENS = 600
"""The most tokens a provider adds when tools are offered: the instructions of its tool
use (Anthropic documents 264 to 530 by model; Qwen's hermes template about 100;
OpenAI's functions namespace a few)."""


def approximate_tokens(characters: int) -> int:
    """The tokens assumed for ``characters`` characters of text."""
    return math.ceil(characters / CHARS_PER_TOKEN)


def approximate_prompt_tokens(messages: Iterable[Message]) -> int:
    """The prompt's tokens by the same rule, with the few tokens each message's role costs."""
    return sum(3 + approximate_tokens(len(message.content or "")) for message in messages)


def approximate_request_tokens(request: ChatRequest) -> int:
    """All a backend is given as its prompt, by the same rule: the messages with the calls
    they make, the tools offered and the format asked for. Schemas and a call's arguments
    are in the prompt too, and a client may make them as large as the body allows."""
    tokens = approximate_prompt_tokens(request.messages)
    shown = _shown(request)
    if shown:
        tokens += approximate_tokens(len(orjson.dumps(shown)))
    return tokens


def utf8_bytes(text: str) -> int:
    """The UTF-8 bytes of ``text`` (its length when it is ASCII, which Python knows)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def prompt_bound(request: ChatRequest) -> int:
    """The most tokens the prompt of ``request`` can be, whatever tokenizer reads it.

    A byte-level BPE token (OpenAI's, Anthropic's, Llama 3's, Qwen's, ...) stands for
    at least one UTF-8 byte, a SentencePiece token with byte fallback too, and a
    WordPiece token for at least one character: so a text is at most its bytes in
    tokens. To the bytes of all a backend is given (the messages' text and names, the
    calls they make, the tools offered, a format's schema, hosted tools) this adds what
    a template writes around them: :data:`MESSAGE_TOKENS` a message,
    :data:`REQUEST_TOKENS` a request, :data:`TOOLS_TOKENS` when tools are offered."""
    tokens = REQUEST_TOKENS
    for message in request.messages:
        tokens += MESSAGE_TOKENS + utf8_bytes(message.content or "")
        if message.name:
            tokens += utf8_bytes(message.name)
    shown = _shown(request)
    if shown:
        tokens += len(orjson.dumps(shown))
    if request.tools or request.hosted_tools:
        tokens += TOOLS_TOKENS
    return tokens


def _shown(request: ChatRequest) -> list[Any]:
    """What a backend is given besides the messages' text: their calls, the tools offered
    (the hosted ones too) and the schema of the format asked for."""
    shown: list[Any] = [call for message in request.messages for call in message.calls]
    shown += [[tool.name, tool.description, tool.parameters] for tool in request.tools]
    shown += request.hosted_tools
    if request.response_format is not None and request.response_format.schema is not None:
        shown.append(request.response_format.schema)
    return shown
