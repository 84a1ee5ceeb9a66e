"""The ``/v1`` endpoints, independent of how the request arrived.

Each endpoint takes a :class:`Call` and returns a :class:`Reply`. Two thin
transports hand calls over and send replies: Django views
(:mod:`chatparity.transport.views`) and the ASGI fast path (:mod:`chatparity.transport.fastpath`). A
transport tells the reply when the client left (:meth:`Reply.cancel`) and when
it is done with it (:meth:`Reply.close`), which closes the request's
:class:`~chatparity.accounting.ledger.Accounting`: after the client has its answer,
and whether the reply was sent in full, failed or was cut short.

:func:`start` is the pipeline of a chat completion, shared by the endpoint and
the admin's trials (:mod:`chatparity.gateway.probe`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from functools import wraps
from typing import Any

import orjson

from ..accounting import keys, limits
from ..accounting.keys import Grant
from ..accounting.ledger import Accounting
from ..accounting.record import UsageRecord
from ..backends import ChatBackend, get_backend, serves_chat
from ..backends.base import current_caller, upstream_calls
from ..conf import app_settings
from ..models import Backend, Deployment, ModelAlias
from ..models import Endpoint as LoggedEndpoint
from ..protocol import errors
from ..protocol.breakpoints import with_breakpoints
from ..protocol.completion import CompletionAccumulator
from ..protocol.errors import APIError
from ..protocol.events import Event
from ..protocol.ids import completion_id, request_id
from ..protocol.openapi import openapi_document
from ..protocol.request import (
    ChatRequest,
    Limits,
    decode_body,
    parse_chat_request,
    parse_model,
    with_defaults,
)
from ..protocol.stream import DONE, ChunkEncoder, sse
from ..protocol.tokens import prompt_bound
from . import cache, routing, semantic
from .auth import authenticate

logger = logging.getLogger(__name__)

JSON = "application/json"
EVENT_STREAM = "text/event-stream; charset=utf-8"
_STREAM_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
# Sent while a stream waits for its backend's first event; OpenAI's clients skip comments.
KEEPALIVE = b": keepalive\n\n"


BodyReader = Callable[[int], Awaitable[bytes]]


@dataclass
class Call:
    """One request to ``/v1``, as a transport hands it over.

    ``headers`` is looked up by lower-case name. The body is not read until the
    endpoint has checked the key: ``read_body(limit)``, awaited once, returns at
    most ``limit`` bytes. A transport reading from the network raises
    :class:`TimeoutError` when they take longer than ``BODY_TIMEOUT`` seconds to
    arrive, and :class:`asyncio.CancelledError` if the client leaves first.
    """

    method: str
    path: str
    headers: Mapping[str, str]
    read_body: BodyReader
    client_ip: str | None
    request_id: str = field(default_factory=request_id)
    query: str = ""
    """The URL's query string, undecoded."""


@dataclass
class Reply:
    """What to send back: a whole body, or a stream of byte frames, and the request's
    accounting, which the transport closes through :meth:`close`."""

    status: int
    headers: dict[str, str]
    body: bytes = b""
    stream: AsyncGenerator[bytes, None] | None = None
    accounting: Accounting | None = None

    @property
    def content_type(self) -> str:
        return self.headers["content-type"]

    def cancel(self) -> None:
        """The client left before the whole reply was sent."""
        if self.accounting is not None:
            self.accounting.cancel()

    async def close(self) -> None:
        """The transport is done with the reply (sent, failed or cut short): its stream
        is closed, stopping the backend behind it, then the accounting is closed."""
        if self.stream is not None:
            await self.stream.aclose()
        if self.accounting is not None:
            await self.accounting.close()


Endpoint = Callable[..., Coroutine[Any, Any, Reply]]


def json_reply(payload: Any, status: int = 200) -> Reply:
    return Reply(status, {"content-type": JSON}, orjson.dumps(payload))


def error_reply(error: APIError) -> Reply:
    reply = json_reply(error.envelope(), status=error.status)
    reply.headers.update(error.headers)
    return reply


ErrorReply = Callable[[APIError, Call], Reply]
"""An endpoint's answer to a failure of ``call``: its API's envelope and status."""


def openai_error(error: APIError, call: Call) -> Reply:
    """A failure in OpenAI's envelope (every endpoint but Anthropic's)."""
    return error_reply(error)


def endpoint(
    *methods: str,
    answer_error: ErrorReply = openai_error,
    request_ids: Callable[[], str] | None = None,
) -> Callable[[Endpoint], Endpoint]:
    """Allow ``methods``, answer failures with ``answer_error`` (in OpenAI's envelope
    unless told), give the call an id of ``request_ids``' making (its API's form; the
    transport's, OpenAI's, unless told) and stamp every reply with ``x-request-id``,
    ``openai-processing-ms``
    and ``x-chatparity-overhead-ms``: of the processing time, what was not spent
    waiting on a backend. Both are measured
    when the reply's headers are ready: a stream's, once its backend's first event came
    (or its first keepalive went out)."""

    def decorate(handler: Endpoint) -> Endpoint:
        @wraps(handler)
        async def wrapper(call: Call, *args: Any, **kwargs: Any) -> Reply:
            started = time.perf_counter()
            if request_ids is not None:
                call.request_id = request_ids()
            if call.method not in methods:
                message = f"Invalid method for URL ({call.method} {call.path})"
                reply = answer_error(APIError(message, status=405), call)
            else:
                try:
                    reply = await handler(call, *args, **kwargs)
                except Exception as exc:
                    if not isinstance(exc, APIError):
                        logger.exception("chatparity: unexpected failure")
                    reply = answer_error(errors.as_api_error(exc), call)
            now = time.perf_counter()
            elapsed = now - started
            if reply.accounting is not None:
                overhead = reply.accounting.overhead(elapsed, now)
            else:
                overhead = elapsed
            headers = reply.headers
            headers["x-request-id"] = call.request_id
            headers["openai-processing-ms"] = str(round(elapsed * 1000))
            headers["x-chatparity-overhead-ms"] = f"{overhead * 1000:.2f}"
            return reply

        return wrapper

    return decorate


_DIGITS = re.compile(r"[0-9]+")


def _limits() -> Limits:
    return Limits(
        max_messages=app_settings.MAX_MESSAGES,
        max_content_chars=app_settings.MAX_CONTENT_CHARS,
        max_inputs=app_settings.MAX_EMBEDDING_INPUTS,
    )


def body_limit(headers: Mapping[str, str]) -> int:
    """How many body bytes a transport should read: none when Content-Length
    already tells a 413, else one past ``MAX_BODY_BYTES`` (which tells an
    oversized body whatever Content-Length said)."""
    limit: int = app_settings.MAX_BODY_BYTES
    declared = headers.get("content-length", "")
    # Measured before int(), which refuses more than 4,300 digits with a ValueError.
    digits = declared.lstrip("0")
    if _DIGITS.fullmatch(declared) and (len(digits) > len(str(limit)) or int(digits or 0) > limit):
        return 0
    return limit + 1


def _body_timeout() -> APIError:
    error = APIError(
        "The request body was not received in time.", status=408, code="request_timeout"
    )
    error.headers["connection"] = "close"  # what is left of the body is not worth waiting for
    return error


async def _decode(call: Call) -> Any:
    """The JSON body: a 408 if it came too slowly, a 413 above ``MAX_BODY_BYTES``
    (unread when Content-Length tells), OpenAI's 400 if it is not JSON."""
    limit = body_limit(call.headers)
    if limit == 0:
        raise errors.request_too_large(app_settings.MAX_BODY_BYTES)
    try:
        body = await call.read_body(limit)
    except TimeoutError:
        raise _body_timeout() from None
    if len(body) > app_settings.MAX_BODY_BYTES:
        raise errors.request_too_large(app_settings.MAX_BODY_BYTES)
    return decode_body(body)


async def _authenticate(call: Call) -> Grant:
    return await authenticate(call.headers.get("authorization", ""))


async def _resolve(model: str, grant: Grant | None) -> ModelAlias:
    """The alias ``model`` names, if ``grant`` may use it; else OpenAI's 404."""
    alias = (await keys.aliases()).find(model, grant)
    if alias is None:
        raise errors.model_not_found(model)
    return alias


async def serving(model: str, grant: Grant | None, accounting: Accounting) -> ModelAlias:
    """The alias ``model`` names, if ``grant`` may use it. Else OpenAI's 404, once the
    request is counted against its key's own limits (their 429 instead, if they refuse
    it) and logged as :data:`~chatparity.accounting.ledger.UNKNOWN_MODEL`: a name made
    up costs what any request costs, and is never stored as sent."""
    try:
        return await _resolve(model, grant)
    except APIError:
        accounting.unknown_model()
        await accounting.reserve(None, limits.NOTHING)
        raise


@endpoint("POST")
async def chat_completions(call: Call) -> Reply:
    return await respond(call, _chat_request)


Prepare = Callable[[Any, Accounting, Grant], Awaitable[tuple[ChatRequest, "Wire"]]]
"""Validates a decoded body for an endpoint: the request backends serve, and the
:class:`Wire` that encodes their answer."""


async def _chat_request(
    body: Any, accounting: Accounting, grant: Grant
) -> tuple[ChatRequest, Wire]:
    return await _requested(body, accounting, grant), ChatWire(accounting)


async def respond(
    call: Call,
    prepare: Prepare,
    *,
    authenticate: Callable[[Call], Awaitable[Grant]] = _authenticate,
    answer_error: ErrorReply = openai_error,
    logged_as: LoggedEndpoint = LoggedEndpoint.CHAT_COMPLETIONS,
) -> Reply:
    """Serve ``call`` through the one pipeline (:func:`serve`): the body validated by
    ``prepare``, the answer streamed or whole, in ``prepare``'s wire."""

    async def answer(body: Any, accounting: Accounting, grant: Grant) -> Reply:
        requested, wire = await prepare(body, accounting, grant)
        answering = _answer(requested, accounting, grant, wire)
        if not requested.stream:
            return json_reply(await (await answering).whole())
        reply = Reply(200, {"content-type": EVENT_STREAM, **_STREAM_HEADERS})
        reply.stream = await _stream(answering, accounting, wire)
        return reply

    return await serve(
        call, answer, authenticate=authenticate, answer_error=answer_error, logged_as=logged_as
    )


Answerer = Callable[[Any, Accounting, Grant], Awaitable[Reply]]
"""Answers a decoded body, noting what it does in the request's accounting."""


async def serve(
    call: Call,
    answer: Answerer,
    *,
    authenticate: Callable[[Call], Awaitable[Grant]] = _authenticate,
    answer_error: ErrorReply = openai_error,
    logged_as: LoggedEndpoint = LoggedEndpoint.CHAT_COMPLETIONS,
    body: bool = True,
) -> Reply:
    """Serve ``call``: the key checked (by ``authenticate``), the request's accounting
    opened, the body read (unless there is none to read: ``answer`` is given None) and
    ``answer``ed, a failure as ``answer_error`` says (the log row, of endpoint
    ``logged_as`` from the start, whatever is wrong with the body, records the status
    the client got), the reply given the rate-limit headers and the accounting its
    transport closes."""
    grant = await authenticate(call)
    accounting = Accounting(
        UsageRecord(
            request_id=call.request_id,
            endpoint=logged_as,
            api_key=grant.key,
            client_ip=call.client_ip,
            user_agent=call.headers.get("user-agent", ""),
            headers=call.headers,
        )
    )
    try:
        reply = await answer(await _decode(call) if body else None, accounting, grant)
    except asyncio.CancelledError:  # the client left before its reply
        accounting.cancel()
        await accounting.close()
        raise
    except Exception as exc:
        reply = answer_error(accounting.fail(exc), call)
        accounting.record.status_code = reply.status
    for name, value in accounting.headers.items():
        reply.headers.setdefault(name, value)
    if accounting.record.cache:
        reply.headers[cache.HEADER] = cache.header_value(accounting.record.cache)
    reply.accounting = accounting
    return reply


async def _stream(
    answering: Coroutine[Any, Any, Answer], accounting: Accounting, wire: Wire
) -> AsyncGenerator[bytes, None]:
    """A stream request's frames, once its backend sent its first event (its failure
    before that raised, for a reply with its own status). A backend slower than
    ``KEEPALIVE_SECONDS`` is not waited for: the frames begin with keepalive comments."""
    starting = asyncio.ensure_future(answering)
    try:
        await asyncio.wait((starting,), timeout=app_settings.KEEPALIVE_SECONDS)
    except asyncio.CancelledError:
        await _abandon(starting)
        raise
    if starting.done():
        return starting.result().frames()
    frames = _keeping_alive(starting, accounting, wire)
    # Run into its try: closed before it was ever read, it still stops the backend.
    await anext(frames)
    return frames


async def _keeping_alive(
    starting: asyncio.Task[Answer], accounting: Accounting, wire: Wire
) -> AsyncGenerator[bytes, None]:
    """A keepalive comment every ``KEEPALIVE_SECONDS`` until ``starting`` has the answer,
    then the answer's frames. The headers went out: a failure to start (fallbacks
    tried, or the first-byte timeout) is told in ``wire``'s frames of a failure."""
    frames: AsyncGenerator[bytes, None] | None = None
    try:
        yield b""  # primed by _stream, not sent
        yield wire.keepalive
        interval = app_settings.KEEPALIVE_SECONDS
        while not (await asyncio.wait((starting,), timeout=interval))[0]:
            yield wire.keepalive
        try:
            frames = starting.result().frames()
        except Exception as exc:
            ending = [*wire.opening(), *wire.failing(accounting.fail(exc, streaming=True))]
            await accounting.settle()
            for payload in ending:
                yield wire.frame(payload)
            yield wire.trailer
            return
        async for frame in frames:
            yield frame
    finally:
        if frames is not None:
            await frames.aclose()
        await _abandon(starting)


async def _abandon(starting: asyncio.Task[Answer]) -> None:
    """Stop an answer still starting, or the backend of the one it started."""
    starting.cancel()
    await asyncio.wait((starting,))
    if not starting.cancelled() and starting.exception() is None:
        await starting.result().chunks.aclose()


@dataclass
class Answer:
    """An answer under way: its payloads (chunks, events), each noted by the request's
    accounting, in its wire's encoding.

    Read it once, with :meth:`whole` or :meth:`frames`.
    """

    request: ChatRequest
    """The request as its alias serves it (with the alias's defaults)."""
    chunks: AsyncGenerator[list[dict[str, Any]], None]
    """The payloads of each backend event (the first's after the wire's opening)."""
    accounting: Accounting
    wire: Wire

    async def whole(self) -> dict[str, Any]:
        """The object the payloads add up to (a ``chat.completion``, a ``response``); an
        :class:`APIError` if the backend failed midway."""
        async for _ in self.chunks:
            pass
        await self.wire.closing()
        await self.accounting.settle()
        return self.wire.whole()

    async def frames(self) -> AsyncGenerator[bytes, None]:
        """The payloads as SSE frames, those of one backend event sent together; a
        failure after the first byte ends them with the wire's frames of a failure.
        Closing it early stops the backend."""
        frame = self.wire.frame
        try:
            async for payloads in self.chunks:
                yield b"".join(map(frame, payloads))
            ending = await self.wire.closing()
        except APIError as error:
            ending = self.wire.failing(self.accounting.fail(error, streaming=True))
        finally:
            await self.chunks.aclose()
        await self.accounting.settle()
        yield b"".join(map(frame, ending)) + self.wire.trailer


class Wire(ABC):
    """One endpoint's encoding of the backend events: chat chunks, Responses events.

    A wire is made for one request and begins once its backend sent its first
    event; :meth:`opening` then :meth:`encode` give its payloads, and either
    :meth:`closing` (all sent) or :meth:`failing` (the backend failed) its last
    ones. A stream sends each as :meth:`frame`, then :attr:`trailer`; a
    non-stream reply is :meth:`whole`.
    """

    trailer: bytes
    """The stream's last bytes, after its last frame."""
    keepalive = KEEPALIVE
    """Sent while the backend has not begun: a comment, which every client skips."""
    uncacheable = ""
    """Why the response cache may not answer this request ("": it may)."""

    def __init__(self, answer_id: str) -> None:
        self.answer_id = answer_id

    @abstractmethod
    def begin(self, request: ChatRequest, system_fingerprint: str) -> None:
        """The request as its alias serves it, and the system fingerprint of the backend
        that answers it (or answered it, for an answer from the response cache)."""

    def opening(self) -> list[dict[str, Any]]:
        """Payloads sent before the first event's."""
        return []

    @abstractmethod
    def encode(self, event: Event) -> list[dict[str, Any]]:
        """The payloads of one backend event."""

    async def closing(self) -> list[dict[str, Any]]:
        """The payloads that end an answer whose backend sent everything."""
        return []

    @abstractmethod
    def failing(self, error: APIError) -> list[dict[str, Any]]:
        """The payloads that end an answer whose backend failed after the first byte."""

    @abstractmethod
    def frame(self, payload: dict[str, Any]) -> bytes:
        """One payload as a server-sent event."""

    @abstractmethod
    def whole(self) -> dict[str, Any]:
        """The non-stream reply, once every payload was encoded and closed."""


class ChatWire(Wire):
    """Chat Completions: chunks, ``[DONE]`` after the last; the non-stream reply is the
    ``chat.completion`` the chunks add up to."""

    trailer = DONE

    def __init__(self, accounting: Accounting) -> None:
        super().__init__(completion_id())
        self._observe_chunk = accounting.observe_chunk
        self._encoder: ChunkEncoder | None = None
        self._accumulator: CompletionAccumulator | None = None

    def begin(self, request: ChatRequest, system_fingerprint: str) -> None:
        self._encoder = ChunkEncoder(
            completion_id=self.answer_id,
            created=int(time.time()),
            model=request.model,
            system_fingerprint=system_fingerprint,
            include_usage=request.include_usage or not request.stream,
            logprobs=request.logprobs,
            legacy_functions=request.legacy_functions,
        )
        if not request.stream:
            self._accumulator = CompletionAccumulator()

    def encode(self, event: Event) -> list[dict[str, Any]]:
        assert self._encoder is not None, "begun before its first event"
        chunks = self._encoder.encode(event)
        for chunk in chunks:
            self._observe_chunk(chunk)
            if self._accumulator is not None:
                self._accumulator.add(chunk)
        return chunks

    def failing(self, error: APIError) -> list[dict[str, Any]]:
        return [error.envelope()]

    def frame(self, payload: dict[str, Any]) -> bytes:
        return sse(payload)

    def whole(self) -> dict[str, Any]:
        assert self._accumulator is not None, "a non-stream request accumulates"
        return self._accumulator.completion()


async def start(
    body: Any,
    accounting: Accounting,
    *,
    grant: Grant | None = None,
    alias: ModelAlias | None = None,
) -> Answer:
    """Start the chat completion ``body`` (a decoded JSON request) asks for, as
    ``/v1/chat/completions`` does: validated, on ``alias`` if given (an admin's
    trial) else on the alias the body names, with that alias's defaults, admitted
    under its limits, on its backend or else on its fallbacks, which ``grant`` must
    allow (None: every alias). Its answer's chunks are noted by ``accounting``,
    which its caller closes. A backend that sends no first event within
    ``FIRST_BYTE_TIMEOUT`` seconds ends it with 504 ``request_timeout``.
    """
    requested = await _requested(body, accounting, grant, alias)
    return await _answer(requested, accounting, grant, ChatWire(accounting), alias)


async def _requested(
    body: Any, accounting: Accounting, grant: Grant | None, alias: ModelAlias | None = None
) -> ChatRequest:
    """The request ``body`` validates as (OpenAI's 400 if it does not), noted by
    ``accounting``. OpenAI checks the model first: unless ``alias`` serves the request,
    an unknown model is the error (a 404) whatever else is wrong with the body."""
    try:
        requested = parse_chat_request(body, _limits())
    except APIError:
        if alias is None:
            await serving(parse_model(body), grant, accounting)
        raise
    accounting.requested(requested, body)
    return requested


def first_byte_timeout() -> APIError:
    return errors.timed_out("The model did not start answering in time.")


async def _answer(
    requested: ChatRequest,
    accounting: Accounting,
    grant: Grant | None,
    wire: Wire,
    alias: ModelAlias | None = None,
) -> Answer:
    """:func:`start` once the body is validated as ``requested``, answered in ``wire``:
    from the response cache when its alias has one that holds the answer, else by its
    backend (the answer then kept in the cache, when it may be)."""
    lookup: cache.Lookup | None = None
    try:
        async with asyncio.timeout(app_settings.FIRST_BYTE_TIMEOUT) as deadline:
            if alias is None:
                alias = await serving(requested.model, grant, accounting)
            if alias.response_cache and grant is not None:
                lookup = await _looked_up(requested, alias, grant, accounting, wire)
                if lookup is not None and lookup.hit is not None:
                    return _replayed(lookup.hit, accounting, wire)
            chat, backend, events, first = await _begin(
                requested, alias, grant, accounting, deadline.when()
            )
    except TimeoutError:
        if not deadline.expired():
            raise
        raise first_byte_timeout() from None
    accounting.answering(wire.answer_id)
    fingerprint = backend.system_fingerprint
    wire.begin(chat, fingerprint)
    if lookup is not None:
        events = lookup.recorded(chat, fingerprint, first, events)
    return Answer(chat, _chunks(first, events, wire, accounting), accounting, wire)


async def _looked_up(
    requested: ChatRequest, alias: ModelAlias, grant: Grant, accounting: Accounting, wire: Wire
) -> cache.Lookup | None:
    """The response cache's part in ``requested`` on ``alias`` (a chat backend's), if the
    alias has one."""
    options = cache.options_of(alias)
    if options is None or not serves_chat(alias.backend):
        return None
    accounting.served_by(alias)
    return await cache.look_up(
        _as_served_by(alias, requested),
        alias,
        grant,
        accounting,
        options,
        unanswerable=wire.uncacheable,
        semantic=semantic.match if options.semantic is not None else None,
    )


def _replayed(hit: cache.Hit, accounting: Accounting, wire: Wire) -> Answer:
    """The answer of a cache hit, in ``wire``'s framing."""
    accounting.answering(wire.answer_id)
    wire.begin(hit.request, hit.system_fingerprint)
    chunks = _chunks(hit.events[0], hit.rest(), wire, accounting, hit.observe)
    return Answer(hit.request, chunks, accounting, wire)


# Failures that mean "this backend is unreachable": the next fallback alias may serve.
_UNAVAILABLE = frozenset({502, 503, 504})


async def _begin(
    requested: ChatRequest,
    alias: ModelAlias,
    grant: Grant | None,
    accounting: Accounting,
    deadline: float | None = None,
) -> tuple[ChatRequest, ChatBackend, AsyncIterator[Event], Event]:
    """Admit the request on ``alias`` and return the first event of one of its
    deployments (:mod:`.routing`), or else of its fallbacks' in order.

    Each alias serves the request on its own terms: its defaults, its maximum
    ``n``, its rate limits and its prices. Only here, before the client has seen
    a byte, may a request move elsewhere. ``deadline``: when (the event loop's
    time) the first event is waited for no more.
    """
    fallbacks = list(alias.fallbacks)
    accounting.served_by(alias)
    route = routing.Route(
        alias, accounting, serves_chat, stream=requested.stream, deadline=deadline
    )
    if route.empty:
        raise errors.not_a_chat_model(alias.public_id)
    chat = _as_served_by(alias, requested)
    chat = await accounting.admit(alias, chat, await _prompt_reserved(route, chat))
    current_caller.set(accounting.caller)  # in this request's task: its backends see it
    upstream_calls.set(accounting.record.upstream)
    while True:
        failure = await _first_event(route, chat, accounting)
        if not isinstance(failure, APIError):
            return chat, *failure
        if failure.status not in _UNAVAILABLE:
            raise failure
        failed = alias
        alias, chat, route = await _fall_back(
            fallbacks, requested, grant, accounting, failure, deadline
        )
        logger.warning("chatparity: %s failed (%s), falling back to %s", failed, failure, alias)


async def _first_event(
    route: routing.Route, chat: ChatRequest, accounting: Accounting
) -> tuple[ChatBackend, AsyncIterator[Event], Event] | APIError:
    """The backend of a deployment of ``route``'s alias, its events and the first of
    them; else why none of its deployments answered."""

    async def ask(deployment: Deployment) -> tuple[ChatBackend, AsyncIterator[Event], Event]:
        backend = get_backend(deployment.backend)
        events = aiter(backend.stream(chat, deployment.model))
        return backend, events, await accounting.first_event(events)

    return await routing.first_answer(route, ask)


async def reserved_prompt(backend: ChatBackend, chat: ChatRequest, model: str) -> int:
    """The prompt ``backend`` makes of ``chat``, for one call, as admission reserves it:
    counted by its tokenizer where it has one (``prompt_tokens``, the local model's, off
    the event loop), else at the bound no tokenizer passes
    (:func:`~chatparity.protocol.tokens.prompt_bound`)."""
    count = getattr(backend, "prompt_tokens", None)
    if count is None:
        return prompt_bound(chat)
    counted: int = await count(chat, model)
    return counted


async def _prompt_reserved(route: routing.Route, chat: ChatRequest) -> int:
    """The prompt admission reserves for ``chat`` on ``route``'s alias: as its one
    deployment counts it, else at the bound no tokenizer passes (what any of several
    deployments may be billed)."""
    if route.group.shared:
        return prompt_bound(chat)
    (deployment,) = route.group.deployments
    return await reserved_prompt(get_backend(deployment.backend), chat, deployment.model)


async def _fall_back(
    fallbacks: list[str],
    requested: ChatRequest,
    grant: Grant | None,
    accounting: Accounting,
    failure: APIError,
    deadline: float | None = None,
) -> tuple[ModelAlias, ChatRequest, routing.Route]:
    """The next of ``fallbacks`` that may serve the request, the admission moved to it,
    with the request as it serves it and its route through the alias's deployments.

    An alias is skipped when ``grant`` may not use it, when the request is not valid
    there (its maximum ``n``), or when its own limits refuse it; when none is left,
    the last refusal of a limit (a 429 that says when to retry) is raised, else
    ``failure``.
    """
    while (alias := await first_usable(fallbacks, grant)) is not None:
        try:
            chat = _as_served_by(alias, requested)
        except APIError:
            continue
        route = routing.Route(
            alias, accounting, serves_chat, stream=requested.stream, deadline=deadline
        )
        try:
            counted = await _prompt_reserved(route, chat)
            return alias, await accounting.switch(alias, chat, counted), route
        except APIError as refusal:
            failure = refusal
    raise failure


def _as_served_by(alias: ModelAlias, requested: ChatRequest) -> ChatRequest:
    """The request with ``alias``'s default parameters under the client's, the extra
    parameters it forwards and its cache breakpoints (where the client set none);
    OpenAI's 400 if it asks for more choices than ``alias`` gives."""
    chat = requested
    if alias.default_params:
        chat = parse_chat_request(with_defaults(alias.default_params, requested.body), _limits())
        # What no chat body holds (a Responses request's hosted tools, ...): the
        # defaults' reading does not see it.
        chat = dataclasses.replace(chat, **requested.beside_body())
    if alias.cache_breakpoints:
        chat = with_breakpoints(chat)
    most = _max_n(alias)
    if chat.n > most:
        raise APIError(
            f"Invalid 'n': integer above maximum value. Expected a value <= {most}, but got"
            f" {chat.n} instead.",
            param="n",
            code="integer_above_max_value",
        )
    if alias.forwarded_params:
        forwarded = frozenset(p for p in alias.forwarded_params if isinstance(p, str))
        chat = dataclasses.replace(chat, forwarded_params=forwarded)
    return chat


def _max_n(alias: ModelAlias) -> int:
    """The most choices one request to ``alias`` may ask for: its own ``max_n``, else
    ``CHATPARITY["MAX_N"]`` for its backend's kind, else 1."""
    if alias.max_n is not None:
        return alias.max_n
    return int(app_settings.MAX_N.get(alias.backend.kind, 1))


async def first_usable(
    public_ids: list[str], grant: Grant | None, serves: Callable[[Backend], bool] = serves_chat
) -> ModelAlias | None:
    """Pop ``public_ids`` up to the first alias that exists, ``grant`` may use and that
    has a deployment that ``serves`` the endpoint (given its backend's row)."""
    while public_ids:
        try:
            alias = await _resolve(public_ids.pop(0), grant)
        except APIError:
            continue
        if routing.group(alias, serves).tiers:
            return alias
    return None


async def _chunks(
    first: Event,
    events: AsyncIterator[Event],
    wire: Wire,
    accounting: Accounting,
    observe: Callable[[Event], None] | None = None,
) -> AsyncGenerator[list[dict[str, Any]], None]:
    """The payloads of each backend event in ``wire``'s encoding (none: nothing), each
    event noted by ``accounting`` (or by ``observe``: a cache hit's); a backend's failure
    midway raised as the :class:`APIError` the client is told. Sent together, the
    payloads of one event cost the server one write: a Responses stream's first event
    makes four."""
    observe, encoded = observe or accounting.observe, wire.encode

    def encode(event: Event) -> list[dict[str, Any]]:
        observe(event)
        return encoded(event)

    try:
        yield [*wire.opening(), *encode(first)]
        async for event in events:
            payloads = encode(event)
            if payloads:
                yield payloads
    except Exception as exc:
        failure = errors.as_api_error(exc)
        if failure is exc:
            raise
        logger.exception("chatparity: backend failed mid-response")
        raise failure from exc
    finally:
        accounting.backend_done()
        await events.aclose()  # type: ignore[attr-defined]


def _model_object(alias: ModelAlias) -> dict[str, Any]:
    return {
        "id": alias.public_id,
        "object": "model",
        "created": int(alias.created_at.timestamp()),
        "owned_by": alias.owned_by,
    }


@endpoint("GET")
async def list_models(call: Call) -> Reply:
    """The aliases the key may use. Logged, costing nothing and counted against no limit:
    it asks no model anything."""
    return await serve(call, _list_models, logged_as=LoggedEndpoint.MODELS, body=False)


async def _list_models(body: None, accounting: Accounting, grant: Grant) -> Reply:
    listed = (await keys.aliases()).listed(grant)
    return json_reply({"object": "list", "data": [_model_object(alias) for alias in listed]})


@endpoint("GET")
async def retrieve_model(call: Call, model: str) -> Reply:
    """One alias the key may use, logged as :func:`list_models` is."""

    async def retrieve(body: None, accounting: Accounting, grant: Grant) -> Reply:
        alias = (await keys.aliases()).find(model, grant, servable=False)
        if alias is None:
            accounting.unknown_model()
            raise APIError(
                f"The model '{model}' does not exist",
                status=404,
                param="model",
                code="model_not_found",
            )
        accounting.served_by(alias)
        return json_reply(_model_object(alias))

    return await serve(call, retrieve, logged_as=LoggedEndpoint.MODELS, body=False)


@endpoint("GET", "POST", "PUT", "PATCH", "DELETE")
async def invalid_url(call: Call) -> Reply:
    raise APIError(f"Invalid URL ({call.method} {call.path})", status=404)


@endpoint("GET")
async def openapi(call: Call) -> Reply:
    """The OpenAPI document of ``/v1``, stating the configured limits; no key needed."""
    document = openapi_document(
        server_url=call.path.rsplit("/", 1)[0],  # where /v1 is mounted
        limits=_limits(),
        max_body_bytes=app_settings.MAX_BODY_BYTES,
    )
    return json_reply(document)
