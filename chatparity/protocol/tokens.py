"""Token counts for backends that report none."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import orjson

from .request import ChatRequest, Message

CHARS_PER_TOKEN = 4
"""OpenAI's rule of thumb for English text."""


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
    shown: list[Any] = [call for message in request.messages for call in message.calls]
    shown += [[tool.name, tool.description, tool.parameters] for tool in request.tools]
    if request.response_format is not None and request.response_format.schema is not None:
        shown.append(request.response_format.schema)
    if shown:
        tokens += approximate_tokens(len(orjson.dumps(shown)))
    return tokens
