"""The response cache: a stage of the pipeline before the backend call (docs/caching.md).

An alias whose ``response_cache`` turns it on answers a request it answered before
from the cache, as the backend's stored events replayed through the asking wire's
encoder (fresh ids and ``created``): a stream or an object in that wire's framing,
whichever form filled the entry. The key (:mod:`chatparity.protocol.caching`) is the
request as the alias serves it, every field that can change the answer and none that
cannot, with the alias, its backend and upstream model, the alias's generation (a
purge bumps it) and the scope: the key's owner (a key without one is its own scope), or
the key alone. Never two owners.

A hit asks no backend: it counts as a request in the key's and the alias's requests per
minute, never in their tokens or budgets (its row costs nothing and says what it
saved). A miss is answered by the backend and, once its answer is whole, kept
(compressed, in a task of its own: the client never waits for the write), when it may
be (:meth:`Lookup.unkept`).

The store is the entry of Django's ``CACHES`` that ``RESPONSE_CACHE["CACHE"]`` names,
shared by every worker. Nothing wrong with it fails a request: a store that is down, an
entry that cannot be read or is too large, a ``Cache-Control`` it does not know are
served uncached, and the log row's ``cache_note`` says why.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from ..accounting import deployments, limits
from ..accounting.batching import OncePerInterval, PerLoop
from ..accounting.keys import Grant
from ..accounting.ledger import Accounting
from ..accounting.record import UsageRecord
from ..conf import app_settings
from ..models import CacheState, ModelAlias
from ..protocol.caching import (
    CacheOptions,
    Control,
    cache_control,
    input_digest,
    parse_cache_options,
    replayed_events,
    reproducible,
    request_digest,
    shares,
    stored_events,
)
from ..protocol.embeddings import Embeddings, EmbeddingsRequest, Input
from ..protocol.events import Event, Finish, ReasoningDelta, TextDelta, ToolCallDelta, Usage
from ..protocol.request import ChatRequest
from ..protocol.tokens import approximate_tokens
from .cache_store import Budget, Unavailable, call

if TYPE_CHECKING:
    from .semantic import Bucket

logger = logging.getLogger(__name__)
_outage_log = OncePerInterval(logger, interval=60.0)

HEADER = "x-chatparity-cache"
ENTRY_VERSION = 1


def header_value(state: str) -> str:
    """``x-chatparity-cache`` for a logged cache state: ``hit`` (a semantic one too),
    ``miss`` (a partial hit too: a backend was asked), ``bypass``."""
    if state in (CacheState.HIT, CacheState.SEMANTIC):
        return "hit"
    return "bypass" if state == CacheState.BYPASS else "miss"


# The store.


def store_name() -> str | None:
    name: str | None = app_settings.RESPONSE_CACHE["CACHE"]
    return name


def budget() -> Budget:
    """What the store may take: ``MAX_BYTES`` written within ``MAX_TTL``, counted in the
    last window of ``MAX_TTL`` seconds and this one (an entry lives at most ``MAX_TTL``,
    so the two bound what is kept)."""
    bounds = app_settings.RESPONSE_CACHE
    max_ttl = int(bounds["MAX_TTL"])
    window = int(time.time() // max_ttl)
    counters = (f"cp:rc:written:{window - 1}", f"cp:rc:written:{window}")
    return Budget(counters, int(bounds["MAX_BYTES"]), 2 * max_ttl)


class Writes:
    """This event loop's writes in flight, each a task the client never waits for."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[None]] = set()

    def start(self, writing: Any) -> None:
        task = asyncio.get_running_loop().create_task(writing)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def drain(self) -> None:
        """Until the writes in flight are done (tests, and a worker that stops)."""
        while self.tasks:
            await asyncio.wait(set(self.tasks))


writes = PerLoop(Writes)


async def kept(name: str, entries: dict[str, bytes], ttl: int) -> None:
    """Keep ``entries`` for ``ttl`` seconds (``MAX_TTL`` at most), within the
    :func:`budget`; a failure logged (once a minute), never raised."""
    longest = int(app_settings.RESPONSE_CACHE["MAX_TTL"])
    try:
        if not await call(name, "write", entries, min(ttl, longest), budget()):
            _outage_log.warning("chatparity: response cache full (MAX_BYTES), an answer not kept")
    except Unavailable as exc:
        _outage_log.warning("chatparity: response cache unavailable, an answer not kept: %s", exc)


# Keys.


def scope_of(grant: Grant, options: CacheOptions) -> str:
    """Whose entries a request reads and writes: its key's owner's (``o<id>``), else (no
    owner, or the alias scoped per key) its key's alone (``k<id>``)."""
    key = grant.key
    if options.scope == "owner" and key.owner_id is not None:
        return f"o{key.owner_id}"
    return f"k{key.pk}"


def served_by(alias: ModelAlias) -> list[Any]:
    """What serves an alias's requests, as the key names it: the alias, each deployment
    that may serve it (its backend, where that sends requests, and its upstream model:
    an answer kept is not served once the deployments change), the parameters it
    forwards."""
    deployed = sorted(
        (d.backend.pk, d.backend.kind, d.backend.base_url, d.model)
        for d in deployments.serving(alias)
    )
    forwarded = sorted(name for name in alias.forwarded_params or () if isinstance(name, str))
    return [alias.pk, deployed, forwarded]


def entry_key(alias: ModelAlias, scope: str, kind: str, digest: str) -> str:
    """A store key: the alias and its generation, the scope, the kind of entry, the
    request's digest."""
    return f"cp:rc:{alias.pk}:{alias.cache_generation}:{scope}:{kind}:{digest}"


def options_of(alias: ModelAlias) -> CacheOptions | None:
    """The alias's cache options, None when it has no cache (or options no form would
    have saved: logged)."""
    try:
        options = parse_cache_options(alias.response_cache, app_settings.RESPONSE_CACHE["MAX_TTL"])
    except ValueError as exc:
        _outage_log.warning("chatparity: alias %s: response_cache ignored: %s", alias, exc)
        return None
    return options if options.enabled else None


def bypassed(record: UsageRecord, note: str) -> None:
    record.cache, record.cache_note = CacheState.BYPASS, note[:80]


def taking_part(record: UsageRecord, grant: Grant, *reasons: str) -> tuple[str, Control] | None:
    """The store and the ``Cache-Control`` of a request of ``grant`` that takes part in the
    cache; None for one that does not (logged as passed by: the first of its own
    ``reasons``, or the store's, the key's, the plan's, the client's)."""
    control = cache_control(record.headers.get("cache-control", ""))
    why = _refusal(grant, control) or next((reason for reason in reasons if reason), "")
    store = store_name()
    if why or store is None:
        bypassed(record, why)
        return None
    return store, control


async def fetched(record: UsageRecord, store: str, method: str, *args: Any) -> Any:
    """:func:`call`; on a store that is down, the request logged as passed by (served
    uncached) before :class:`Unavailable` is raised."""
    try:
        return await call(store, method, *args)
    except Unavailable as exc:
        _outage_log.warning("chatparity: response cache unavailable, served uncached: %s", exc)
        bypassed(record, "store unavailable")
        raise


def _refusal(grant: Grant, control: Control) -> str:
    """Why a request of ``grant`` with ``control`` neither reads nor writes the cache
    ("": it may do either)."""
    if not grant.key.response_cache:
        return "off for this key"
    plan = grant.key.owner_plan
    if plan is not None and not plan.response_cache:
        return "off for this key's plan"
    if control.unknown:
        return f"Cache-Control: {control.unknown} not understood"
    if not control.read and not control.write:
        return "Cache-Control: no-cache, no-store"
    if store_name() is None:
        return 'no RESPONSE_CACHE["CACHE"]'
    return ""


# A chat request's lookup.


@dataclass
class Lookup:
    """The cache's part in one chat request: its entry's key and, on a hit, the answer."""

    alias: ModelAlias
    options: CacheOptions
    control: Control
    store: str
    scope: str
    key: str
    record: UsageRecord
    hit: Hit | None = None
    semantic: Bucket | None = None
    """The request's bucket in the semantic cache, if it has one."""

    async def recorded(
        self, chat: ChatRequest, fingerprint: str, first: Event, events: AsyncIterator[Event]
    ) -> AsyncGenerator[Event, None]:
        """``events`` passed on as they come; once the backend (whose system fingerprint
        is ``fingerprint``) sent them all, the answer (``first`` and them) is kept, if it
        may be. An answer cut short (the client left, the backend failed) is not."""
        answer = [first]
        try:
            async for event in events:
                answer.append(event)
                yield event
        finally:
            await events.aclose()  # type: ignore[attr-defined]
        note = self.unkept(chat, answer)
        if note:
            self.record.cache_note = note
            return
        entry = orjson.dumps([ENTRY_VERSION, fingerprint, stored_events(answer)])
        if len(entry) > app_settings.RESPONSE_CACHE["MAX_ENTRY_BYTES"]:
            self.record.cache_note = f"too large to keep ({len(entry)} bytes)"
            return
        writes.get().start(self._keep(entry))

    def unkept(self, chat: ChatRequest, answer: Sequence[Event]) -> str:
        """Why a whole answer is not kept ("": it is)."""
        if not self.control.write:
            return "Cache-Control: no-store"
        if chat.completion_limit is not None:
            return "completion cut to what a limit left"
        served = self.record.model_alias
        if served is None or served.pk != self.alias.pk:
            return "answered by a fallback"
        finished = {event.index for event in answer if isinstance(event, Finish)}
        if finished != set(range(chat.n)):
            return "answer unfinished"
        if not self.options.tool_calls and any(isinstance(e, ToolCallDelta) for e in answer):
            return "calls tools"
        return ""

    async def _keep(self, entry: bytes) -> None:
        await kept(self.store, {self.key: zlib.compress(entry)}, self.options.ttl)
        if self.semantic is not None:
            await self.semantic.add(self.key)


@dataclass
class Hit:
    """An answer from the cache: the stored events, replayed for the request."""

    request: ChatRequest
    system_fingerprint: str
    events: list[Event]
    record: UsageRecord

    async def rest(self) -> AsyncGenerator[Event, None]:
        """The events after the first."""
        for event in self.events[1:]:
            yield event

    def observe(self, event: Event) -> None:
        """Note a replayed event: the finish reasons and the first token as any answer's,
        the usage as what the hit saved (nothing was spent)."""
        record = self.record
        if isinstance(event, Usage):
            record.saved = event
        elif isinstance(event, Finish):
            record.finish_reasons[event.index] = event.reason
        elif record.first_token_at is None and isinstance(
            event, TextDelta | ToolCallDelta | ReasoningDelta
        ):
            record.first_token_at = time.perf_counter()


def hit_of(entry: Any, chat: ChatRequest, record: UsageRecord) -> Hit | None:
    """The answer an entry holds (None: none, or none that can be read, logged)."""
    if entry is None:
        return None
    try:
        version, fingerprint, stored = orjson.loads(zlib.decompress(entry))
        if version != ENTRY_VERSION:
            return None
        events = replayed_events(stored)
    except (TypeError, ValueError, zlib.error, orjson.JSONDecodeError, IndexError) as exc:
        logger.warning("chatparity: an unreadable response cache entry (%s) ignored", exc)
        return None
    if not events:
        return None
    return Hit(chat, str(fingerprint), events, record)


SemanticLookup = Callable[[Lookup, ChatRequest, Grant], Awaitable[None]]


async def look_up(
    chat: ChatRequest,
    alias: ModelAlias,
    grant: Grant,
    accounting: Accounting,
    options: CacheOptions,
    *,
    unanswerable: str = "",
    semantic: SemanticLookup | None = None,
) -> Lookup | None:
    """The cache's part in ``chat`` (a request as ``alias`` serves it, on its wire):
    None when it takes none (logged as passed by, and why); else its entry's key and, on
    a hit, the answer, the request counted in its requests per minute (a 429 past
    them). ``unanswerable``: why its wire cannot be answered from the cache.
    ``semantic``: how a single-turn request is matched when no entry is its own."""
    record = accounting.record
    unreproducible = not options.nonreproducible and not reproducible(chat)
    part = taking_part(
        record,
        grant,
        unanswerable,
        "not reproducible (temperature above 0, no seed)" if unreproducible else "",
        "hosted tools" if chat.hosted_tools else "",
    )
    if part is None:
        return None
    store, control = part
    scope = scope_of(grant, options)
    key = entry_key(alias, scope, "chat", request_digest(chat, served_by(alias)))
    lookup = Lookup(alias, options, control, store, scope, key, record)
    if not control.read:
        bypassed(record, "Cache-Control: no-cache")
        if semantic is not None:
            await semantic(lookup, chat, grant)  # to add the answer to its bucket
        return lookup
    try:
        entry = await fetched(record, store, "get", key)
    except Unavailable:
        return None
    lookup.hit = hit_of(entry, chat, record)
    if entry is not None and lookup.hit is None:
        record.cache_note = "entry unreadable"
    if lookup.hit is None and semantic is not None:
        await semantic(lookup, chat, grant)
    if lookup.hit is None:
        record.cache = CacheState.MISS
        if not control.write:
            record.cache_note = "Cache-Control: no-store"
        return lookup
    await accounting.reserve(alias, limits.NOTHING)
    record.cache = record.cache or CacheState.HIT
    return lookup


# An embeddings request's lookup: one entry per input.


@dataclass
class Vectors:
    """The cache's part in an embeddings request: each input's entry key, and the
    vectors found (with the tokens their inputs were)."""

    request: EmbeddingsRequest
    alias: ModelAlias
    options: CacheOptions
    control: Control
    store: str
    keys: list[str]
    found: dict[int, tuple[bytes, int]]
    record: UsageRecord

    @property
    def missing(self) -> list[int]:
        """The inputs to embed, by index."""
        return [index for index in range(len(self.keys)) if index not in self.found]

    def asked(self) -> EmbeddingsRequest:
        """The request for the missing inputs alone."""
        inputs = tuple(self.request.inputs[index] for index in self.missing)
        sent = [text if isinstance(text, str) else list(text) for text in inputs]
        return dataclasses.replace(
            self.request, inputs=inputs, body={**self.request.body, "input": sent}
        )

    def answer(self, embedded: Embeddings | None) -> Embeddings:
        """Every input's vector: found, or ``embedded`` (the missing inputs' answer, kept
        when it may be); its usage the tokens of them all."""
        vectors: list[bytes] = [b""] * len(self.keys)
        tokens = 0
        for index, (vector, counted) in self.found.items():
            vectors[index] = vector
            tokens += counted
        self.record.saved = Usage(tokens, 0)
        if embedded is None:
            return Embeddings(vectors, tokens)
        missing = self.missing
        each = shares(embedded.prompt_tokens, [_weight(self.request.inputs[i]) for i in missing])
        entries = {}
        for index, vector, counted in zip(missing, embedded.vectors, each, strict=True):
            vectors[index] = bytes(vector)
            entries[self.keys[index]] = counted.to_bytes(4, "little") + vectors[index]
        note = self.unkept()
        if note:
            self.record.cache_note = note
        else:
            writes.get().start(kept(self.store, entries, self.options.ttl))
        return Embeddings(vectors, tokens + embedded.prompt_tokens, embedded.counted)

    def unkept(self) -> str:
        if not self.control.write:
            return "Cache-Control: no-store"
        served = self.record.model_alias
        if served is None or served.pk != self.alias.pk:
            return "answered by a fallback"
        return ""


def _weight(text: Input) -> int:
    return approximate_tokens(len(text)) if isinstance(text, str) else len(text)


async def look_up_vectors(
    request: EmbeddingsRequest,
    alias: ModelAlias,
    grant: Grant,
    accounting: Accounting,
    options: CacheOptions,
) -> Vectors | None:
    """The cache's part in an embeddings ``request`` on ``alias``: None when it takes none
    (logged as passed by, and why); else each input's key and the vectors found. A
    request whose every vector is found is counted in its requests per minute (a 429
    past them) and asks no backend."""
    record = accounting.record
    part = taking_part(record, grant)
    if part is None:
        return None
    store, control = part
    scope = scope_of(grant, options)
    by = served_by(alias)
    keys = [
        entry_key(alias, scope, "vector", input_digest(text, request.dimensions, by))
        for text in request.inputs
    ]
    vectors = Vectors(request, alias, options, control, store, keys, {}, record)
    if not control.read:
        bypassed(record, "Cache-Control: no-cache")
        return vectors
    try:
        held = await fetched(record, store, "get_many", keys)
    except Unavailable:
        return None
    for index, key in enumerate(keys):
        value = held.get(key)
        if isinstance(value, bytes) and len(value) > 4:
            vectors.found[index] = (value[4:], int.from_bytes(value[:4], "little"))
    if len(vectors.found) == len(keys):
        accounting.served_by(alias)
        await accounting.reserve(alias, limits.NOTHING)
        record.cache = CacheState.HIT
    else:
        record.cache = CacheState.PARTIAL if vectors.found else CacheState.MISS
        if not control.write:
            record.cache_note = "Cache-Control: no-store"
    return vectors
