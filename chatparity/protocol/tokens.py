"""Token counts for backends that report none."""

from __future__ import annotations

import math
from collections.abc import Iterable

from .request import Message

CHARS_PER_TOKEN = 4
"""OpenAI's rule of thumb for English text."""


def approximate_tokens(characters: int) -> int:
    """The tokens assumed for ``characters`` characters of text."""
    return math.ceil(characters / CHARS_PER_TOKEN)


def approximate_prompt_tokens(messages: Iterable[Message]) -> int:
    """The prompt's tokens by the same rule, with the few tokens each message's role costs."""
    return sum(3 + approximate_tokens(len(message.content or "")) for message in messages)
