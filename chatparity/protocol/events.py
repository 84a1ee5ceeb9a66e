"""The normalized events every backend yields, per choice index.

A backend speaks only in these; the protocol layer turns them into SSE chunks
or an accumulated ``chat.completion``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TopLogprob:
    token: str
    logprob: float
    bytes: list[int] | None


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A fragment of the assistant's text for choice ``index``."""

    index: int
    text: str
    logprobs: list[TokenLogprob] | None = None
    tokens: int = 1
    """How many completion tokens this fragment accounts for."""


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A fragment of tool call ``call_index``; ``id`` and ``name`` only on its first."""

    index: int
    call_index: int
    arguments: str
    id: str | None = None
    name: str | None = None
    tokens: int = 1


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """A fragment of the model's reasoning (its thinking) for choice ``index``, before
    its answer; only wires that show thinking send it on."""

    index: int
    text: str
    tokens: int = 1


@dataclass(frozen=True, slots=True)
class Finish:
    index: int
    reason: str
    """One of :data:`~chatparity.protocol.enums.FINISH_REASONS`."""
    stop_sequence: str | None = None
    """Which of the request's stop sequences ended the choice, when the backend says."""


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts for the whole request; yielded once, after every Finish.

    ``prompt_tokens`` counts every input token, as OpenAI's ``prompt_tokens`` does:
    those read from the provider's prompt cache (``cached_tokens``) and those written to
    it (``cache_write_5m_tokens``, ``cache_write_1h_tokens``, by the entry's lifetime)
    included. Anthropic's ``input_tokens`` is what is left of it."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    cache_write_5m_tokens: int = 0
    cache_write_1h_tokens: int = 0
    counted: bool = False
    """The gateway counted these tokens from what it received: the backend reported
    none, or numbers it could not believe."""

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def cache_write_tokens(self) -> int:
        """Input tokens written to the provider's prompt cache, whatever their lifetime."""
        return self.cache_write_5m_tokens + self.cache_write_1h_tokens


Event = TextDelta | ToolCallDelta | ReasoningDelta | Finish | Usage


@dataclass(slots=True)
class UpstreamCalls:
    """The calls a backend made upstream on one request's behalf, noted as it makes them:
    for each, the usage the upstream said it would bill, of which its prompt tokens, cache
    reads and cache writes count (None: not said yet). The request is charged each call's
    prompt whether or not its answer ends (see :mod:`chatparity.accounting.settlement`)."""

    prompts: list[Usage | None] = field(default_factory=list)

    def sent(self) -> None:
        """A call's request goes out: it counts from now on."""
        self.prompts.append(None)

    def refused(self) -> None:
        """The call just sent was refused (an error status, a connection that failed
        before any answer): the upstream bills nothing for it."""
        self.prompts.pop()

    def announced(self, usage: Usage) -> None:
        """The upstream said the call just sent reads the prompt of ``usage``, with its
        cache reads and writes (Anthropic's ``message_start``, any usage it reported)."""
        self.prompts[-1] = usage

    @property
    def usage(self) -> Usage | None:
        """The usage the upstream said of the call just sent so far (a Messages upstream's
        ``message_start``: its prompt, read from and written to its cache), if it said."""
        return self.prompts[-1] if self.prompts else None
