"""Anthropic's Messages API: ``/v1/messages`` and ``/v1/messages/count_tokens``.

``POST /v1/messages`` is served by the same pipeline as chat completions
(:func:`~chatparity.gateway.pipeline.respond`: keys, aliases, admission,
fallbacks, time-outs, accounting), its request turned into the chat request
backends serve (:mod:`chatparity.protocol.messages`) and their events encoded
by :class:`MessagesWire` (:mod:`chatparity.protocol.messages_stream`). Its
differences are Anthropic's: the key in ``x-api-key`` (or ``Authorization:
Bearer``, as Claude Code sends it), errors in Anthropic's envelope with its
statuses and a ``request-id`` header, ``ping`` events while a slow backend
has not begun. ``?beta=true`` and the ``anthropic-version`` and
``anthropic-beta`` headers are accepted (see the policy in
:mod:`~chatparity.protocol.messages`).

``POST /v1/messages/count_tokens`` counts the prompt a request would send: with
the serving backend's tokenizer where it has one (``count_tokens``: the local
model's), else estimated at four characters a token (its tools, calls and schema
too). It is not a model call: its log row (endpoint ``messages.count_tokens``)
costs nothing and carries no tokens; but it counts against the key's requests per
minute (a model it may not use too) and takes a slot in flight while it counts, as
Anthropic rate-limits counting by requests per minute.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypedDict

from ..accounting import limits
from ..accounting.keys import Grant
from ..accounting.ledger import Accounting
from ..accounting.record import UsageRecord
from ..backends import get_backend
from ..conf import app_settings
from ..models import Endpoint
from ..protocol import errors, messages
from ..protocol.errors import APIError
from ..protocol.events import Event
from ..protocol.ids import anthropic_id
from ..protocol.messages import (
    MessagesRequest,
    as_chat_request,
    error_body,
    error_status,
    parse_messages_request,
)
from ..protocol.messages_stream import PING, MessageEncoder, sse_event
from ..protocol.request import ChatRequest
from ..protocol.tokens import approximate_prompt_tokens, approximate_request_tokens
from .auth import authenticate, authenticate_key
from .pipeline import (
    Call,
    ErrorReply,
    Reply,
    Wire,
    _as_served_by,
    _limits,
    endpoint,
    json_reply,
    respond,
    serve,
    serving,
)
from .responses import LoggedResponse


async def _authenticate(call: Call) -> Grant:
    """The key in ``x-api-key`` (Anthropic's SDKs), else in ``Authorization: Bearer``
    (Claude Code with ``ANTHROPIC_AUTH_TOKEN``); Anthropic's 401 if neither."""
    presented = call.headers.get("x-api-key", "").strip()
    if presented:
        return await authenticate_key(presented)
    authorization = call.headers.get("authorization")
    if authorization:
        return await authenticate(authorization)
    raise messages.missing_api_key()


def request_id() -> str:
    """A request's id as Anthropic makes them (``request-id``, ``x-request-id``)."""
    return anthropic_id("req")


def error_reply(error: APIError, call: Call) -> Reply:
    """A failure in Anthropic's envelope, with its status and ``request-id``."""
    reply = json_reply(error_body(error, call.request_id), status=error_status(error))
    reply.headers.update(error.headers)
    return _stamped(reply, call)


class _Anthropics(TypedDict):
    authenticate: Callable[[Call], Awaitable[Grant]]
    answer_error: ErrorReply


_ANTHROPICS = _Anthropics(authenticate=_authenticate, answer_error=error_reply)
"""How Anthropic's endpoints are served: its keys, its envelope."""


def _stamped(reply: Reply, call: Call) -> Reply:
    """``reply`` with Anthropic's ``request-id`` header."""
    reply.headers["request-id"] = call.request_id
    return reply


@endpoint("POST", answer_error=error_reply, request_ids=request_id)
async def create_message(call: Call) -> Reply:
    answer = respond(call, _messages_request, logged_as=Endpoint.MESSAGES, **_ANTHROPICS)
    return _stamped(await answer, call)


async def _messages_request(
    body: Any, accounting: Accounting, grant: Grant
) -> tuple[ChatRequest, Wire]:
    requested = parse_messages_request(body, _limits())
    chat = as_chat_request(requested, _limits())
    accounting.requested(chat, body)
    return chat, MessagesWire(requested, chat, accounting.record)


class MessagesWire(Wire):
    """Anthropic's encoding: named events (``event:`` lines), ``ping`` while the backend
    has not begun, no trailer; the non-stream reply is the message the events add up to."""

    trailer = b""
    keepalive = PING

    def __init__(self, request: MessagesRequest, chat: ChatRequest, record: UsageRecord) -> None:
        super().__init__(anthropic_id("msg"))
        self._record = record
        self._encoder = MessageEncoder(
            message_id=self.answer_id,
            model=request.model,
            input_tokens=approximate_prompt_tokens(chat.messages),
            request_id=record.request_id,
            streaming=request.stream,
            ping_every=app_settings.KEEPALIVE_SECONDS,
        )

    def begin(self, request: ChatRequest, system_fingerprint: str) -> None:
        """Nothing of the alias or its backend shows in a message."""

    def opening(self) -> list[dict[str, Any]]:
        return self._encoder.opening(self._record.upstream.usage)

    def encode(self, event: Event) -> list[dict[str, Any]]:
        return self._encoder.encode(event)

    async def closing(self) -> list[dict[str, Any]]:
        events = self._encoder.closing()
        self._log_body()
        return events

    def failing(self, error: APIError) -> list[dict[str, Any]]:
        events = self._encoder.failing(error)
        self._log_body()
        return events

    def frame(self, payload: dict[str, Any]) -> bytes:
        return sse_event(payload)

    def whole(self) -> dict[str, Any]:
        return self._encoder.message()

    def _log_body(self) -> None:
        if self._record.body is not None:  # LOG_BODIES
            self._record.body = LoggedResponse(self._encoder.message())


@endpoint("POST", answer_error=error_reply, request_ids=request_id)
async def count_tokens(call: Call) -> Reply:
    """The input tokens of a Messages request, on the alias it names."""
    answer = serve(call, _count_tokens, logged_as=Endpoint.COUNT_TOKENS, **_ANTHROPICS)
    return _stamped(await answer, call)


async def _count_tokens(body: Any, accounting: Accounting, grant: Grant) -> Reply:
    requested = parse_messages_request(body, _limits(), counting=True)
    chat = as_chat_request(requested, _limits())
    accounting.requested(chat, body)
    alias = await serving(chat.model, grant, accounting)
    accounting.served_by(alias)
    chat = _as_served_by(alias, chat)
    backend = get_backend(alias.backend)
    if not hasattr(backend, "stream"):  # as creating a message there would be
        raise errors.not_a_chat_model(alias.public_id)
    # A request, if no model call: under the key's requests per minute and slots in
    # flight (a tokenizer's work is real), spending no token, budget or alias limit.
    await accounting.reserve(None, limits.NOTHING)
    counter = getattr(backend, "count_tokens", None)
    if counter is not None:
        tokens = await counter(chat, alias.model)
    else:
        tokens = approximate_request_tokens(chat)
    await accounting.settle()  # the slot given back before the answer goes out
    return json_reply({"input_tokens": tokens})


@endpoint("GET", "POST", "PUT", "PATCH", "DELETE", answer_error=error_reply, request_ids=request_id)
async def not_found(call: Call) -> Reply:
    """Anything else under ``/v1/messages/``: Anthropic's 404 (no batches here)."""
    raise messages.not_found(call.path)
