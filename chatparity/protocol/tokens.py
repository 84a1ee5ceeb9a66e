"""Token counts for backends that report none."""

from __future__ import annotations

import math
from collections.abc import Iterable

from .request import Message


def approximate_tokens(text: str) -> int:
    """OpenAI's rule of thumb for English: about four characters a token."""
    return math.ceil(len(text) / 4)


def approximate_prompt_tokens(messages: Iterable[Message]) -> int:
    """The prompt's tokens by the same rule, with the few tokens each message's role costs."""
    return sum(3 + approximate_tokens(message.content or "") for message in messages)
