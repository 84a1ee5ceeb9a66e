"""Reading what an OpenAI-compatible upstream streams, whatever its quirks.

:class:`SSEReader` turns the lines of a ``text/event-stream`` body into
events (comments and keepalives skipped, multi-line data joined, ``event:
error`` kept apart). :class:`ChunkReader` turns the upstream's
``chat.completion.chunk`` objects into normalized backend events, repairing
what real servers get wrong: changing ids (ignored: the encoder sets its
own), a missing or repeated role, a finish_reason riding on a content chunk,
tool-call ids and names repeated on later deltas, a missing finisher or
``[DONE]``, usage missing or on the wrong chunk. Its usage is believed only
when every count is a whole number from 0 to :data:`MAX_REPORTED_TOKENS` and
the completion within what the request allowed; else the tokens are counted
from what was received, and the usage says so (``Usage.counted``). What an
upstream sends instead (an error, something malformed) becomes an
:class:`UpstreamError`, whose message tells clients nothing the upstream wrote.
"""

from __future__ import annotations

import email.utils
import math
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson

from . import ids
from .enums import FINISH_REASONS, FinishReason
from .errors import APIError
from .events import (
    Event,
    Finish,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Usage,
)
from .request import CHAT_COMPLETION_REQUEST, PROMPT_CACHE_PARAMETERS
from .tokens import approximate_tokens

MAX_REPORTED_TOKENS = 10**9
"""The most tokens an upstream's usage is believed in any one count (two of them still
fit the log's 32-bit columns)."""
_DIGITS = re.compile(r"[0-9]{1,10}")  # a count written as a string, as some servers do


@dataclass(frozen=True, slots=True)
class ServerSentEvent:
    event: str
    data: str


@dataclass
class SSEReader:
    """Folds body lines into server-sent events (the WHATWG rules, leniently); an event
    whose data is over ``limit`` characters is malformed (many lines add up)."""

    limit: int | None = None
    _data: list[str] = field(default_factory=list)
    _size: int = 0
    _event: str = ""

    def feed(self, line: str) -> ServerSentEvent | None:
        """Take one line (without its end); return the event a blank line completes."""
        if not line:
            return self.flush()
        if line.startswith(":"):
            return None  # a comment: keepalive
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
            self._size += len(value) + 1
            if self.limit is not None and self._size > self.limit:
                raise malformed(f"an event is over {self.limit} characters")
        elif name == "event":
            self._event = value
        return None

    def flush(self) -> ServerSentEvent | None:
        """The event in progress, also when the body ended without its blank line."""
        if not self._data:
            self._event = ""
            return None
        event = ServerSentEvent(self._event or "message", "\n".join(self._data))
        self._data, self._size, self._event = [], 0, ""
        return event


class UpstreamError(APIError):
    """An upstream's failure as clients see it: a message of ours with the upstream's
    status, type and code.

    ``detail`` is what the upstream sent (its error message, or an excerpt), for the
    server's log; ``upstream_message`` its own error message, if it sent one. Upstream
    texts may name internal hosts or carry secrets: they reach clients only when a
    backend opts in. ``retry_after``: the seconds it asked to wait, if it said
    (:func:`retry_after`).
    """

    def __init__(
        self, message: str, *, detail: str = "", upstream_message: str = "", **fields: Any
    ) -> None:
        super().__init__(message, **fields)
        self.detail = detail
        self.upstream_message = upstream_message
        self.retry_after: float | None = None


MAX_RETRY_AFTER = 86_400.0
"""The longest wait an upstream's answer is believed to ask for."""


def retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """The seconds an upstream's answer asks to wait before asking again: its
    ``retry-after-ms`` (OpenAI's), else its ``Retry-After`` in seconds or as an HTTP
    date (RFC 9110); None when it says nothing that can be believed (a negative or
    unreadable value, more than a day)."""
    milliseconds = headers.get("retry-after-ms")
    if milliseconds is not None:
        seconds = _number(milliseconds)
        if seconds is not None:
            return _believed(seconds / 1000)
    given = headers.get("retry-after")
    if given is None:
        return None
    seconds = _number(given)
    if seconds is not None:
        return _believed(seconds)
    try:
        moment = email.utils.parsedate_to_datetime(given)
    except (TypeError, ValueError, IndexError):
        return None
    if moment.tzinfo is None:
        return None
    return _believed(max(0.0, moment.timestamp() - (time.time() if now is None else now)))


def _number(text: str) -> float | None:
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _believed(seconds: float) -> float | None:
    return seconds if 0 <= seconds <= MAX_RETRY_AFTER else None


# What an upstream's type, code or param must look like to be passed on: identifiers
# and parameter paths, never free text.
_IDENTIFIER = re.compile(r"[A-Za-z0-9_.:\-\[\]]{1,64}")
DETAIL_CHARS = 500  # of an upstream's text, kept for the log


def _identifier(value: Any) -> str | None:
    text = str(value) if isinstance(value, str | int) and not isinstance(value, bool) else ""
    return text if _IDENTIFIER.fullmatch(text) else None


def upstream_error(payload: Any, status: int | None = None) -> UpstreamError:
    """The error an upstream answered with HTTP ``status`` (None: within a 2xx answer),
    from its error envelope or whatever it sent instead (``payload``: decoded JSON, or
    text). Clients get a 4xx status as is, anything else as 502."""
    error = payload.get("error") if isinstance(payload, dict) else None
    kind = code = param = None
    message = error if isinstance(error, str) else ""
    if isinstance(error, dict):
        message = error["message"] if isinstance(error.get("message"), str) else ""
        kind, code = _identifier(error.get("type")), _identifier(error.get("code"))
        param = _identifier(error.get("param"))
    said = [f"status {status}"] if status is not None else []
    if code is not None:
        said.append(f"code '{code}'")
    circumstances = f" ({', '.join(said)})" if said else ""
    client_status = status if status is not None and 400 <= status < 500 else 502
    return UpstreamError(
        f"The upstream model returned an error{circumstances}.",
        detail=excerpt(message or payload),
        upstream_message=message,
        status=client_status,
        type=kind or ("server_error" if client_status >= 500 else "invalid_request_error"),
        param=param,
        code=code if isinstance(error, dict) else "upstream_error",
    )


def malformed(problem: str, sent: str | bytes = "") -> UpstreamError:
    """The upstream sent something that is not OpenAI's wire format: ``problem`` says what,
    in our words; an excerpt of what it ``sent`` is kept for the log."""
    return UpstreamError(
        f"The upstream sent a malformed stream: {problem}.",
        detail=excerpt(sent),
        status=502,
        type="server_error",
        code="upstream_error",
    )


@contextmanager
def well_shaped(sent: str | bytes) -> Iterator[None]:
    """Where what an upstream ``sent`` is taken apart: a part missing or of the wrong type
    (a delta that is not an object, a logprob that is not a number, ...) makes it
    malformed."""
    try:
        yield
    except (AttributeError, LookupError, TypeError, ValueError):
        raise malformed("a part of it is of the wrong type", sent) from None


def excerpt(sent: Any) -> str:
    """The start of what an upstream sent (text, bytes or decoded JSON), for the log."""
    if isinstance(sent, bytes):
        text = sent[:DETAIL_CHARS].decode("utf-8", "replace")
    elif isinstance(sent, str):
        text = sent
    else:
        text = "" if sent is None else orjson.dumps(sent).decode()
    return text[:DETAIL_CHARS]


class ChunkReader:
    """Normalized events from one upstream stream of ``n`` choices, numbered from
    ``first_index`` (an upstream asked for one more choice answers as index 0).

    A choice that called tools finishes with ``call_finish`` (``stop`` when the
    client named the tool, as OpenAI does). Token counts come from the
    upstream's usage when it sends one; otherwise each content or argument
    delta counts as one completion token (servers stream a token a delta) and
    the prompt counts ``prompt_tokens``; so they do when the upstream's usage is
    not believable (:func:`believable_usage`; ``max_tokens``: the request's cap
    per choice), which ``refused_usage`` then keeps for the log.
    """

    def __init__(
        self,
        *,
        n: int,
        prompt_tokens: int,
        call_finish: FinishReason = "tool_calls",
        first_index: int = 0,
        max_tokens: int | None = None,
    ) -> None:
        self.indices = range(first_index, first_index + n)
        self.prompt_tokens = prompt_tokens
        self.call_finish = call_finish
        self.most_completion_tokens = MAX_REPORTED_TOKENS if max_tokens is None else max_tokens * n
        self.completion_tokens = 0
        self.upstream_usage: Usage | None = None
        self.refused_usage: Any = None
        self.done = False
        self._seen: set[int] = set()
        self._finished: set[int] = set()
        self._calls: dict[tuple[int, int], str] = {}

    def read(self, sse: ServerSentEvent) -> list[Event]:
        """The events in one server-sent event; raises the upstream's error as APIError."""
        if sse.data.strip() == "[DONE]":
            self.done = True
            return []
        chunk = self._payload(sse.data, "a chunk", error_event=sse.event == "error")
        events: list[Event] = []
        try:  # well_shaped's try, inline: a context manager per event costs 2% of a stream
            for choice in chunk.get("choices") or ():
                if isinstance(choice, dict):
                    events += self._choice(choice)
        except (AttributeError, TypeError, ValueError):
            raise malformed("a part of it is of the wrong type", sse.data) from None
        return events

    def read_completion(self, body: bytes) -> list[Event]:
        """The events in a whole ``chat.completion`` (the answer to a request that
        did not stream): each choice's message read as one delta carrying all of it."""
        self.done = True
        completion = self._payload(body, "the completion")
        events: list[Event] = []
        with well_shaped(body):
            for choice in completion.get("choices") or ():
                if isinstance(choice, dict):
                    message = choice.get("message")
                    delta = dict(message) if isinstance(message, dict) else {}
                    calls = delta.get("tool_calls")
                    if isinstance(calls, list):  # a message's calls carry no index: their order
                        delta["tool_calls"] = [
                            {**call, "index": slot} for slot, call in enumerate(calls)
                            if isinstance(call, dict)
                        ]  # fmt: skip
                    events += self._choice({**choice, "delta": delta}, whole=True)
        return events

    def _payload(self, data: str | bytes, what: str, *, error_event: bool = False) -> Any:
        """``data`` as a JSON object, its usage noted; the upstream's error (or what
        makes it malformed) raised."""
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise malformed("invalid JSON", data) from None
        if error_event or (isinstance(payload, dict) and "error" in payload):
            raise upstream_error(payload)
        if not isinstance(payload, dict):
            raise malformed(f"{what} is not a JSON object", data)
        if isinstance(payload.get("usage"), dict):  # the last one sent stands
            self.upstream_usage = believable_usage(payload["usage"], self.most_completion_tokens)
            self.refused_usage = None if self.upstream_usage else payload["usage"]
        return payload

    def _choice(self, choice: dict[str, Any], *, whole: bool = False) -> list[Event]:
        index = choice.get("index", 0)
        if not isinstance(index, int):
            return []
        index += self.indices.start
        if index not in self.indices or index in self._finished:
            return []  # nothing may follow a choice's finisher
        self._seen.add(index)
        delta = choice.get("delta") or {}
        events: list[Event] = []
        # Reasoning, as servers that show it name it (vLLM, llama.cpp, DeepSeek; OpenRouter).
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            tokens = _tokens(reasoning, whole)
            self.completion_tokens += tokens
            events.append(ReasoningDelta(index, reasoning, tokens))
        content = delta.get("content")
        if isinstance(content, str) and content:
            logprobs = _logprobs(choice.get("logprobs"))
            tokens = len(logprobs) if logprobs else _tokens(content, whole)
            self.completion_tokens += tokens
            events.append(TextDelta(index, content, logprobs=logprobs, tokens=tokens))
        for call in delta.get("tool_calls") or ():
            events += self._tool_call(index, call, whole=whole)
        reason = choice.get("finish_reason")
        if reason:
            events += self.close([index], reason)
        return events

    def _tool_call(self, index: int, call: dict[str, Any], *, whole: bool) -> list[Event]:
        slot = call.get("index", 0)
        function = call.get("function") or {}
        arguments = function.get("arguments") or ""
        if arguments:
            self.completion_tokens += _tokens(arguments, whole)
        if (index, slot) in self._calls:  # a later delta: only its arguments count
            return [ToolCallDelta(index, slot, arguments)] if arguments else []
        call_id = call.get("id") or ids.call_id()
        self._calls[(index, slot)] = call_id
        name = function.get("name") or ""
        return [ToolCallDelta(index, slot, arguments, id=call_id, name=name, tokens=0)]

    def body_ended(self) -> None:
        """The stream's body ended before its end: chat servers that leave out ``[DONE]``
        are many, and what is open is finished."""

    def unseen(self) -> list[int]:
        """The choices the upstream sent nothing for (some servers ignore ``n``)."""
        return [index for index in self.indices if index not in self._seen]

    def close(self, indices: Iterable[int], reason: str = "stop") -> list[Event]:
        """Finishers for those of ``indices`` still open."""
        events: list[Event] = []
        for index in indices:
            if index in self._finished:
                continue
            self._finished.add(index)
            called = any(i == index for i, _ in self._calls)
            finish = self.call_finish if called else reason
            events.append(Finish(index, finish if finish in FINISH_REASONS else "stop"))
        return events

    @property
    def usage(self) -> Usage:
        """The upstream's usage, or else the counted one."""
        return self.upstream_usage or Usage(
            self.prompt_tokens, self.completion_tokens, counted=True
        )


def _tokens(text: str, whole: bool) -> int:
    """Tokens counted for a delta when the upstream reports no usage: a streamed
    delta is a token; a whole message, its length's worth."""
    return approximate_tokens(len(text)) if whole else 1


def believable_usage(usage: dict[str, Any], most_completion_tokens: int) -> Usage | None:
    """An upstream's ``usage`` object, in Chat Completions' names, as :class:`Usage` if it
    can be believed (see :func:`believed_usage`); the details may be left out. The cache
    writes OpenRouter reports (``prompt_tokens_details.cache_write_tokens``) are 5m's."""
    prompt_details = usage.get("prompt_tokens_details") or {}
    completion_details = usage.get("completion_tokens_details") or {}
    if not isinstance(prompt_details, dict) or not isinstance(completion_details, dict):
        return None
    return believed_usage(
        usage.get("prompt_tokens"),
        usage.get("completion_tokens"),
        most_completion_tokens,
        cached=prompt_details.get("cached_tokens") or 0,
        reasoning=completion_details.get("reasoning_tokens") or 0,
        write_5m=prompt_details.get("cache_write_tokens") or 0,
    )


def believed_usage(
    prompt: Any,
    completion: Any,
    most_completion_tokens: int,
    *,
    cached: Any = 0,
    reasoning: Any = 0,
    write_5m: Any = 0,
    write_1h: Any = 0,
) -> Usage | None:
    """An upstream's counts as :class:`Usage` (``prompt``: every input token, those read
    from and written to its cache among them), if each is a whole number from 0 to
    :data:`MAX_REPORTED_TOKENS`, the completion no more than ``most_completion_tokens``
    and the cache's tokens no more than the prompt; else None."""
    sent = (prompt, completion, cached, reasoning, write_5m, write_1h)
    counts = [count for count in map(_count, sent) if count is not None]
    if len(counts) < len(sent):
        return None
    prompt_tokens, completion_tokens, read, thought, written_5m, written_1h = counts
    if completion_tokens > most_completion_tokens:
        return None
    if read + written_5m + written_1h > prompt_tokens:
        return None
    return Usage(
        prompt_tokens,
        completion_tokens,
        cached_tokens=read,
        reasoning_tokens=thought,
        cache_write_5m_tokens=written_5m,
        cache_write_1h_tokens=written_1h,
    )


def _count(value: Any) -> int | None:
    """A token count as upstreams write it (a JSON integer, an integral number, a string
    of digits), if it is one from 0 to :data:`MAX_REPORTED_TOKENS`."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    elif isinstance(value, str) and _DIGITS.fullmatch(value):
        value = int(value)  # at most 10 digits: int() is cheap and cannot refuse them
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_REPORTED_TOKENS:
        return value
    return None


def _logprobs(logprobs: Any) -> list[TokenLogprob] | None:
    entries = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not entries:
        return None
    return [
        TokenLogprob(
            token=entry.get("token", ""),
            logprob=float(entry.get("logprob", 0.0)),
            bytes=entry.get("bytes"),
            top_logprobs=[
                TopLogprob(top.get("token", ""), float(top.get("logprob", 0.0)), top.get("bytes"))
                for top in entry.get("top_logprobs") or ()
            ],
        )
        for entry in entries
    ]


# The request parameters an upstream gets whatever the alias: the conversation and
# what shapes sampling and format, billed by nothing but the tokens they shape.
# (model, stream and stream_options are the backend's own.) Not here, so only when
# an alias forwards them: service_tier (a dearer tier), store and metadata (the
# conversation kept upstream), web_search_options (paid searches), audio and
# modalities (audio output), prediction (rejected predicted tokens are billed),
# user and safety_identifier (claims the gateway cannot check, made in the name of
# the upstream's account). The prompt cache's parameters are forwarded: without them
# an agent's cached prefix is not found, and its input is billed in full.
FORWARDED = frozenset(
    {
        "messages",
        "temperature",
        "top_p",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "n",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "seed",
        "response_format",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "functions",
        "function_call",
        "reasoning_effort",
        "verbosity",
        *PROMPT_CACHE_PARAMETERS,
    }
)


REQUEST_PARAMETERS = frozenset(member.name for member in CHAT_COMPLETION_REQUEST.members)
# Parameters an alias cannot forward: those the backend sets itself.
BACKENDS_OWN = frozenset({"model", "stream", "stream_options"})


def check_forwarded_params(names: Any) -> None:
    """Raise ValueError unless ``names`` (an alias's ``forwarded_params``) lists request
    parameters an upstream would not get otherwise: neither in :data:`FORWARDED` nor
    the backend's own."""
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise ValueError('List the names of request parameters, e.g. ["service_tier"].')
    for name in names:
        if name in FORWARDED:
            raise ValueError(f"{name!r} is always forwarded: leave it out.")
        if name in BACKENDS_OWN:
            raise ValueError(f"{name!r} is set by the backend itself.")
        if name not in REQUEST_PARAMETERS:
            raise ValueError(f"{name!r} is not a Chat Completions request parameter.")
