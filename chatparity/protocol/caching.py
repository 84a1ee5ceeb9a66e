"""What the response cache needs to know of a request, without Django: an alias's cache
options, the ``Cache-Control`` a client sends, the key of a request (every field that can
change the answer and none that cannot), and a backend's events as an entry stores them.

Every wire (Chat Completions, Responses, Messages) is served as the chat request its
backend receives: the key is computed from that request as its alias serves it (the
alias's defaults in it), so the wire's own framing (ids, ``stream``, echoed settings)
never enters it, and one entry answers every wire in its own framing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

import orjson

from .embeddings import Input
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
from .ids import call_id
from .request import ChatRequest

Scope = Literal["owner", "key"]
SCOPES: tuple[Scope, ...] = ("owner", "key")
DEFAULT_TTL = 3600
DEFAULT_THRESHOLD = 0.9
"""The similarity a semantic hit needs by default (cosine, of unit vectors)."""


@dataclass(frozen=True, slots=True)
class SemanticOptions:
    threshold: float = DEFAULT_THRESHOLD
    embeddings: str = ""
    """The embeddings alias that embeds a request's text; empty: the embedded model."""


@dataclass(frozen=True, slots=True)
class CacheOptions:
    """An alias's response cache (``ModelAlias.response_cache``)."""

    enabled: bool = False
    ttl: int = DEFAULT_TTL
    """Seconds an entry is served."""
    scope: Scope = "owner"
    """Whose requests share entries: the key's owner's keys (a key without an owner is
    its own scope), or each key alone. Never two owners."""
    nonreproducible: bool = False
    """Also answers requests that are not reproducible (temperature above 0, no seed)."""
    tool_calls: bool = False
    """Also keeps answers that call tools."""
    semantic: SemanticOptions | None = None
    """Single-turn requests also match a stored one whose user text is this similar."""


OFF = CacheOptions()
_OPTIONS = frozenset({"enabled", "ttl", "scope", "nonreproducible", "tool_calls", "semantic"})
_SEMANTIC = frozenset({"threshold", "embeddings"})


def parse_cache_options(value: Any, max_ttl: float) -> CacheOptions:
    """An alias's ``response_cache`` JSON; ValueError saying what is wrong. ``{}`` (or
    ``null``) is off."""
    if not value:
        return OFF
    if not isinstance(value, dict):
        raise ValueError('Give an object, e.g. {"enabled": true, "ttl": 3600}.')
    unknown = sorted(set(value) - _OPTIONS)
    if unknown:
        raise ValueError(f"Unknown option {unknown[0]!r}: known are {', '.join(sorted(_OPTIONS))}.")
    for name in ("enabled", "nonreproducible", "tool_calls"):
        if not isinstance(value.get(name, False), bool):
            raise ValueError(f"{name!r} is true or false.")
    ttl = value.get("ttl", min(DEFAULT_TTL, int(max_ttl)))
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not 0 < ttl <= max_ttl:
        raise ValueError(f"'ttl' is a whole number of seconds from 1 to {max_ttl:g}.")
    scope = value.get("scope", "owner")
    if scope not in SCOPES:
        raise ValueError(f"'scope' is one of {', '.join(map(repr, SCOPES))}.")
    return CacheOptions(
        enabled=value.get("enabled", False),
        ttl=ttl,
        scope=scope,
        nonreproducible=value.get("nonreproducible", False),
        tool_calls=value.get("tool_calls", False),
        semantic=_semantic(value.get("semantic")),
    )


def _semantic(value: Any) -> SemanticOptions | None:
    if value is None or value is False:
        return None
    if value is True:
        return SemanticOptions()
    if not isinstance(value, dict) or set(value) - _SEMANTIC:
        raise ValueError(
            "'semantic' is true, or an object of 'threshold' (0 to 1) and 'embeddings' (an"
            " embeddings alias)."
        )
    threshold = value.get("threshold", DEFAULT_THRESHOLD)
    if isinstance(threshold, bool) or not isinstance(threshold, int | float):
        raise ValueError("'semantic.threshold' is a number from 0 to 1.")
    if not 0 < threshold <= 1:
        raise ValueError("'semantic.threshold' is a number from 0 to 1.")
    embeddings = value.get("embeddings", "")
    if not isinstance(embeddings, str):
        raise ValueError("'semantic.embeddings' is the public id of an embeddings alias.")
    return SemanticOptions(float(threshold), embeddings)


# Cache-Control.


@dataclass(frozen=True, slots=True)
class Control:
    """What a request's ``Cache-Control`` allows: reading an entry, writing one; and the
    directive it did not understand ("": none), for which it is served uncached."""

    read: bool = True
    write: bool = True
    unknown: str = ""


ANYTHING = Control()
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+(=[!-~]*)?")


def cache_control(header: str) -> Control:
    """A request's ``Cache-Control``: ``no-cache`` (answer without reading the cache),
    ``no-store`` (keep nothing of this answer), both; anything else unknown (the request
    is served uncached, and its log row says which directive)."""
    if not header:
        return ANYTHING
    read = write = True
    for part in header.split(","):
        directive = part.strip().lower()
        if directive == "no-cache":
            read = False
        elif directive == "no-store":
            write = False
        elif directive:
            shown = directive if _TOKEN.fullmatch(directive) else "(unreadable)"
            return Control(read=False, write=False, unknown=shown[:64])
    return Control(read, write)


# The key.

IGNORED = frozenset(
    {
        "model",  # the alias, matched in any case: its identity is in the key
        "stream",
        "stream_options",
        "user",
        "metadata",
        "store",
        "safety_identifier",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "service_tier",
    }
)
"""Request parameters that cannot change the answer: who asks, how it is framed and
delivered, what is kept of it."""

ANSWER_FIELDS = (
    "n", "max_tokens", "temperature", "top_p", "seed", "stop", "presence_penalty",
    "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "response_format", "tools",
    "tool_choice", "parallel_tool_calls", "legacy_functions", "reasoning_effort", "hosted_tools",
)  # fmt: skip
"""The fields of a parsed chat request that can change its answer, as parsed (so that
``max_completion_tokens`` and ``max_tokens``, or a stop string and a list of it, are one)."""

NOT_ANSWER_FIELDS = (
    "model", "messages", "body", "stream", "include_usage", "user", "service_tier",
    "cache_control", "translated_markers", "forwarded_params", "completion_limit",
)  # fmt: skip
"""The others: the conversation is read from the body as sent (its parts, names and
calls as the upstream receives them); prompt caching's markers change what an answer
costs, never what it says; what the alias forwards and its model are keyed as the
alias's; a completion cut by a budget is never stored."""

# Body members parsed into ANSWER_FIELDS (or the conversation), read from there.
_PARSED = frozenset(
    {
        "messages", "n", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed",
        "stop", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs",
        "response_format", "tools", "tool_choice", "parallel_tool_calls", "functions",
        "function_call", "reasoning_effort",
    }
)  # fmt: skip
_SKIPPED = IGNORED | _PARSED
_DUMPING = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS


def canonical_request(chat: ChatRequest) -> dict[str, Any]:
    """Everything of ``chat`` (a request as its alias serves it) that can change its
    answer: the conversation (messages as sent, a null member as absent), the parsed
    parameters of :data:`ANSWER_FIELDS`, and any other member of the body but those
    :data:`IGNORED` (``verbosity``, ``prediction``, ...)."""
    canonical: dict[str, Any] = {name: getattr(chat, name) for name in ANSWER_FIELDS}
    canonical["tools"] = [
        dataclasses.replace(tool, cache_control=None) if tool.cache_control else tool
        for tool in chat.tools
    ]
    canonical["messages"] = [_present(message) for message in chat.body.get("messages", ())]
    for name, value in chat.body.items():
        if name not in _SKIPPED and value is not None:
            canonical[f"body.{name}"] = value
    return canonical


def _present(value: Any) -> Any:
    """A message, a part or a call as it says: without null members and prompt caching's
    markers."""
    if isinstance(value, list):
        return [_present(item) for item in value]
    if isinstance(value, dict):
        return {
            name: _present(item)
            for name, item in value.items()
            if item is not None and name != "cache_control"
        }
    return value


def digest(value: Any) -> str:
    """A short hash of a JSON value, the same for the same value in any key order."""
    return hashlib.blake2b(orjson.dumps(value, option=_DUMPING), digest_size=16).hexdigest()


def request_digest(chat: ChatRequest, served_by: Sequence[Any]) -> str:
    """The key of ``chat`` on what serves it (``served_by``: the alias, its backend and
    upstream model, what it forwards): :func:`canonical_request` hashed."""
    return digest([served_by, canonical_request(chat)])


def input_digest(text: Input, dimensions: int | None, served_by: Sequence[Any]) -> str:
    """The key of one input of an embeddings request (its text or token ids) at
    ``dimensions``; the encoding asked for and ``user`` cannot change the vector."""
    return digest([served_by, dimensions, text])


def reproducible(chat: ChatRequest) -> bool:
    """Whether the same request is expected to get the same answer: greedy sampling
    (temperature 0), or a ``seed``."""
    return chat.temperature == 0 or chat.seed is not None


# Single-turn requests, for the semantic cache.


def single_turn(chat: ChatRequest) -> str | None:
    """The user's text of a single-turn request (system or developer instructions, then
    one user message), None for any other conversation."""
    messages = chat.messages
    if not messages or messages[-1].role != "user":
        return None
    if any(message.role not in ("system", "developer") for message in messages[:-1]):
        return None
    return messages[-1].content


def bucket_digest(chat: ChatRequest, served_by: Sequence[Any]) -> str:
    """The key of what a single-turn request must match exactly to be answered by a
    similar one: everything :func:`request_digest` hashes but the user's text."""
    canonical = canonical_request(chat)
    *instructions, asking = canonical["messages"]
    unsaid = {name: value for name, value in asking.items() if name != "content"}
    canonical["messages"] = [*instructions, unsaid]
    return digest([served_by, "bucket", canonical])


_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_NEGATION = re.compile(
    r"\b(?:not|no|never|none|nothing|nobody|neither|nor|without|cannot|isn't|aren't|wasn't"
    r"|weren't|don't|doesn't|didn't|won't|wouldn't|can't|couldn't|shouldn't|mustn't)\b|n't\b"
)


def facts(text: str) -> str:
    """The numbers and negations ``text`` states, in order: an embedding barely tells
    "2 + 2" from "2 + 3", or a question from its negation, so a semantic hit needs these
    to agree word for word. A short string, never the text."""
    text = text.lower().replace("\u2019", "'")
    return orjson.dumps([_NUMBER.findall(text), _NEGATION.findall(text)]).decode()


# Events, as an entry keeps them.

Stored = list[Any]


def stored_events(events: Iterable[Event]) -> list[Stored]:
    """``events`` as JSON lists, the first member saying which event."""
    stored: list[Stored] = []
    for event in events:
        if isinstance(event, TextDelta):
            stored.append(["t", event.index, event.text, event.tokens, event.logprobs])
        elif isinstance(event, ToolCallDelta):
            stored.append(
                ["c", event.index, event.call_index, event.arguments, event.id, event.name,
                 event.tokens]
            )  # fmt: skip
        elif isinstance(event, ReasoningDelta):
            stored.append(["r", event.index, event.text, event.tokens])
        elif isinstance(event, Finish):
            stored.append(["f", event.index, event.reason, event.stop_sequence])
        else:
            stored.append(["u", {name: getattr(event, name) for name in _USAGE}])
    return stored


_USAGE = tuple(field.name for field in fields(Usage))


def replayed_events(stored: Iterable[Stored]) -> list[Event]:
    """The events :func:`stored_events` kept, each tool call with a fresh id (of the
    form a backend makes), the same id for every fragment of one call."""
    events: list[Event] = []
    fresh: dict[str, str] = {}
    for item in stored:
        kind = item[0]
        if kind == "t":
            logprobs = None if item[4] is None else [_logprob(each) for each in item[4]]
            events.append(TextDelta(item[1], item[2], logprobs, item[3]))
        elif kind == "c":
            made = item[4]
            if made is not None:
                made = fresh.setdefault(made, call_id())
            events.append(ToolCallDelta(item[1], item[2], item[3], made, item[5], item[6]))
        elif kind == "r":
            events.append(ReasoningDelta(item[1], item[2], item[3]))
        elif kind == "f":
            events.append(Finish(item[1], item[2], item[3]))
        elif kind == "u":
            events.append(Usage(**item[1]))
        else:
            raise ValueError(f"not a stored event: {kind!r}")
    return events


def _logprob(stored: dict[str, Any]) -> TokenLogprob:
    top = [TopLogprob(**each) for each in stored.get("top_logprobs", ())]
    return TokenLogprob(stored["token"], stored["logprob"], stored["bytes"], top)


def shares(total: int, weights: Sequence[int]) -> list[int]:
    """``total`` split in proportion to ``weights``, in whole parts that add up to it (the
    largest remainders rounded up): the tokens of each input of an embeddings request,
    whose usage says only their sum."""
    if not weights:
        return []
    weight = sum(weights)
    if weight <= 0:
        weights, weight = [1] * len(weights), len(weights)
    exact = [total * each / weight for each in weights]
    parts = [int(each) for each in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: parts[i] - exact[i])
    for index in by_remainder[: total - sum(parts)]:
        parts[index] += 1
    return parts
