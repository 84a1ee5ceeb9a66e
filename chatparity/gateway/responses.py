"""The Responses API: ``/v1/responses`` and the responses it stores.

``POST /v1/responses`` is served by the same pipeline as chat completions
(:func:`chatparity.gateway.pipeline.respond`: keys, admission, fallbacks, time-outs,
accounting), its request turned into the chat request backends serve and
their events encoded by :class:`ResponsesWire`. A response made with
``store`` (the default) is kept with its input as a
:class:`~chatparity.models.StoredResponse` before its last event goes out, so
the client may read it, list its input, delete it or continue it
(``previous_response_id``) at once: with the key that made it, or another
key of the same owner, for ``RESPONSES_RETENTION`` seconds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any, Literal, get_args
from urllib.parse import parse_qs

import orjson
from asgiref.sync import sync_to_async
from django.db import DatabaseError, connections
from django.db.models import Q, QuerySet, Sum
from django.utils import timezone

from ..accounting import keys, limits
from ..accounting.batching import BatchWriter, PerLoop, reconnecting
from ..accounting.keys import Grant
from ..accounting.ledger import Accounting
from ..accounting.record import UsageRecord, storable
from ..backends import get_backend
from ..backends.upstream import UpstreamBackend
from ..conf import app_settings
from ..models import Endpoint, StoredResponse
from ..protocol import errors
from ..protocol.completion import CompletionAccumulator
from ..protocol.errors import APIError
from ..protocol.events import Event
from ..protocol.ids import random_id
from ..protocol.request import ChatRequest
from ..protocol.responses import (
    ResponsesRequest,
    as_chat_request,
    hosted_tool_refused,
    parse_responses_request,
    previous_response_not_found,
    response_not_found,
)
from ..protocol.responses_stream import ResponseEncoder, sse_event
from ..protocol.schema import Enum, Integer
from .pipeline import (
    Call,
    Reply,
    Wire,
    _limits,
    endpoint,
    json_reply,
    respond,
    serve,
    serving,
)

logger = logging.getLogger(__name__)


@endpoint("POST")
async def create_response(call: Call) -> Reply:
    return await respond(call, _responses_request, logged_as=Endpoint.RESPONSES)


async def _responses_request(
    body: Any, accounting: Accounting, grant: Grant
) -> tuple[ChatRequest, Wire]:
    record = accounting.record
    requested = parse_responses_request(body, _limits(), random_id)
    history = await _history(requested, grant, accounting)
    chat = as_chat_request(requested, history, _limits())
    accounting.requested(chat, body)
    if chat.hosted_tools:
        chat = await _hosted_tools_served(requested, chat, grant, accounting)
    return chat, ResponsesWire(requested, grant, record)


HostedToolsPolicy = Literal["omit", "refuse", "pass"]
HOSTED_TOOLS_POLICIES: tuple[HostedToolsPolicy, ...] = get_args(HostedToolsPolicy)


def hosted_tools_policy(public_id: str) -> str:
    """What ``CHATPARITY["HOSTED_TOOLS"]`` says of the alias ``public_id`` (its own
    entry, matched case-insensitively, else ``"*"``'s)."""
    policies = {name.lower(): policy for name, policy in app_settings.HOSTED_TOOLS.items()}
    return policies.get(public_id.lower(), policies.get("*", "omit"))


async def _hosted_tools_served(
    requested: ResponsesRequest, chat: ChatRequest, grant: Grant, accounting: Accounting
) -> ChatRequest:
    """``chat`` with its hosted tools as the alias it names serves them, as its
    :func:`hosted_tools_policy` says: passed on to an upstream that speaks the Responses
    API only when the policy is ``"pass"`` (they run on the deployer's upstream account:
    its vector stores, files, MCP servers and paid tools), else left out (the log row
    names them) or refused (logged under the alias). A model no alias serves is the
    pipeline's 404, with nothing hosted passed on."""
    alias = (await keys.aliases()).find(chat.model, grant, servable=False)
    if alias is None:
        return dataclasses.replace(chat, hosted_tools=())
    policy = hosted_tools_policy(alias.public_id)
    backend = get_backend(alias.backend)
    if (
        policy == "pass"
        and isinstance(backend, UpstreamBackend)
        and backend.wire_api == "responses"
    ):
        return chat
    if policy == "refuse":
        accounting.served_by(alias)
        raise hosted_tool_refused(requested)
    accounting.record.omitted_tools = [tool["type"] for tool in chat.hosted_tools]
    return dataclasses.replace(chat, hosted_tools=())


class ResponsesWire(Wire):
    """The Responses API's encoding: typed events with ``event:`` lines, ending with the
    response's last event and no trailer; the non-stream reply is the response object
    that event carries. A stored response is written before its last event goes out."""

    trailer = b""

    def __init__(self, request: ResponsesRequest, grant: Grant, record: UsageRecord) -> None:
        super().__init__(random_id("resp"))
        if request.previous_response_id is not None:
            self.uncacheable = "continues a stored response"
        self._request = request
        self._grant = grant
        self._record = record
        self._encoder = ResponseEncoder(
            response_id=self.answer_id,
            created_at=int(time.time()),
            model=request.model,
            settings=request.settings,
            new_id=random_id,
            streaming=request.stream,
            names=request.names,
        )

    def begin(self, request: ChatRequest, system_fingerprint: str) -> None:
        """Nothing of the alias or its backend shows in a response."""

    def opening(self) -> list[dict[str, Any]]:
        return self._encoder.opening()

    def encode(self, event: Event) -> list[dict[str, Any]]:
        return self._encoder.encode(event)

    async def closing(self) -> list[dict[str, Any]]:
        events = self._encoder.closing()
        response = self._encoder.response()
        self._log_body(response)
        if self._request.store:
            await _store(self._request, response, self._grant)
        return events

    def failing(self, error: APIError) -> list[dict[str, Any]]:
        events = self._encoder.failing(error)
        self._log_body(self._encoder.response())
        return events

    def frame(self, payload: dict[str, Any]) -> bytes:
        return sse_event(payload)

    def whole(self) -> dict[str, Any]:
        return self._encoder.response()

    def _log_body(self, response: dict[str, Any]) -> None:
        if self._record.body is not None:  # LOG_BODIES
            self._record.body = LoggedResponse(response)


class LoggedResponse(CompletionAccumulator):
    """A response as the log's ``response_body`` holds it.

    ``UsageRecord.body`` is typed for chat completions' accumulator; a response
    is already whole when it is logged.
    """

    def __init__(self, response: dict[str, Any]) -> None:
        super().__init__()
        self._response = response

    def completion(self) -> dict[str, Any]:
        return self._response


# Storage.


def _visible(grant: Grant) -> QuerySet[StoredResponse]:
    """The stored responses ``grant``'s key may see: its own and its owner's keys', within
    ``RESPONSES_RETENTION``."""
    key = grant.key
    mine = Q(api_key=key) if key.owner_id is None else Q(api_key=key) | Q(owner=key.owner_id)
    oldest = timezone.now() - timedelta(seconds=app_settings.RESPONSES_RETENTION)
    return StoredResponse.objects.filter(mine, created_at__gte=oldest)


@reconnecting
def _save(batch: list[StoredResponse]) -> None:
    StoredResponse.objects.bulk_create(batch)


class Keeper(BatchWriter[StoredResponse]):
    """Writes the responses of concurrent requests together. Its failure policy is
    fail-the-refused-row: nothing is retried or set aside, and a response the database
    refuses fails only its own request's write."""

    async def save(self, rows: list[StoredResponse]) -> None:
        await sync_to_async(_save)(rows)


_keepers = PerLoop(Keeper)
"""This event loop's keeper."""


async def _store(request: ResponsesRequest, response: dict[str, Any], grant: Grant) -> None:
    """Keep ``response`` and its input. A database that cannot take it now costs the
    client nothing but later reads of it: logged, not raised."""
    input_items = storable(request.input)  # PostgreSQL's JSON takes no NUL character
    kept = storable(response)
    stored = StoredResponse(
        id=response["id"],
        api_key=grant.key,
        owner_id=grant.key.owner_id,
        previous_response_id=request.previous_response_id or "",
        model=request.model[: StoredResponse._meta.get_field("model").max_length],
        status=response["status"],
        input_items=input_items,
        response=kept,
        size=_json_bytes(input_items) + _json_bytes(kept),
    )
    try:
        await _keepers.get().write(stored)
    except DatabaseError:
        logger.exception("chatparity: response %s was answered but not stored", stored.id)
    else:
        await limits.count_stored(grant.key.pk, stored.size)


def _json_bytes(value: Any) -> int:
    """The bytes of ``value`` as JSON: what the bounds of stored responses count."""
    return len(orjson.dumps(value))


async def _history(
    requested: ResponsesRequest, grant: Grant, accounting: Accounting
) -> list[dict[str, Any]]:
    """The items of the conversation ``requested`` continues (the input and output of
    the responses before it, oldest first); OpenAI's 400 if ``grant`` may not see the
    one it names. A response it continued that expired since ends the history there.

    A request that stores or continues a response is admitted under its key's limits
    first (OpenAI checks the model first: a model it may not use is the 404), then
    bounded by ``STORED_RESPONSE_BYTES`` before anything stored is read, with OpenAI's
    400 past a bound. A request that does neither reads nothing here."""
    response_id = requested.previous_response_id
    if response_id is None and not requested.store:
        return []
    bounds = app_settings.STORED_RESPONSE_BYTES
    adding = _json_bytes(storable(requested.input)) if requested.store else 0
    if adding > bounds["RESPONSE"]:
        raise _too_large_to_store(adding, bounds["RESPONSE"])
    alias = await serving(requested.model, grant, accounting)
    accounting.served_by(alias)
    cap = requested.chat.get("max_tokens") or limits.completion_cap(alias)
    await accounting.reserve(alias, limits.Estimate(0, cap))
    if response_id is not None and not _may_exist(response_id):
        raise previous_response_not_found(response_id)
    try:
        if requested.store:
            await _check_room(grant, adding, bounds["KEY"])
        if response_id is None:
            return []
        chain = await sync_to_async(_chain)(
            response_id, grant, app_settings.MAX_MESSAGES + 1, bounds["CHAIN"] - adding
        )
    except DatabaseError:
        logger.exception("chatparity: stored responses could not be read")
        raise errors.service_unavailable("Stored responses cannot be read right now.") from None
    if not chain:
        raise previous_response_not_found(response_id)
    return [item for stored in reversed(chain) for item in _items_of(stored)]


@reconnecting
def _held(key_id: int) -> int:
    """The bytes the key's stored responses hold, within ``RESPONSES_RETENTION``."""
    oldest = timezone.now() - timedelta(seconds=app_settings.RESPONSES_RETENTION)
    kept = StoredResponse.objects.filter(api_key_id=key_id, created_at__gte=oldest)
    return int(kept.aggregate(held=Sum("size"))["held"] or 0)


def _may_exist(response_id: str) -> bool:
    """Whether a stored response could have this id: none holds a NUL character (which
    PostgreSQL refuses in a query) or more characters than the column."""
    return "\x00" not in response_id and len(response_id) <= _ID_LENGTH


_ID_LENGTH = StoredResponse._meta.get_field("id").max_length or 0


def _too_large_to_store(size: int, most: int) -> APIError:
    return APIError(
        f"The input is too large to store: {size} bytes, above the {most} one stored"
        " response may hold. Send it with 'store': false, or shorten it.",
        param="input",
    )


async def _check_room(grant: Grant, adding: int, most: int) -> None:
    """OpenAI's 400 unless ``grant``'s key has room for ``adding`` more bytes of stored
    responses, within ``most`` for what it keeps (as counted: the database is asked an
    hour at most)."""
    key_id = grant.key.pk
    held = await limits.stored_bytes(key_id, lambda: sync_to_async(_held)(key_id))
    if held is not None and held + adding > most:
        raise APIError(
            f"This key's stored responses hold {held} bytes: {adding} more would pass the"
            f" {most} a key may keep. Delete some, or send 'store': false.",
            param="store",
        )


@reconnecting
def _chain(response_id: str, grant: Grant, most: int, most_bytes: int) -> list[StoredResponse]:
    """``response_id`` and the responses it continued, newest first, as far as ``grant``
    sees them, ``most`` of them at most: each gives the conversation one message at
    least, so more than ``MAX_MESSAGES`` is refused whatever the rest would be.
    OpenAI's 400 if they hold more than ``most_bytes``, before any is read.

    Two queries, not one a response: the chain's ids and sizes in one recursive query,
    over what ``grant`` sees; then those responses."""
    visible = _visible(grant)
    database = visible.db
    columns = visible.values_list("id", "previous_response_id", "size")
    subquery, params = columns.query.sql_with_params()
    statement = (
        "WITH RECURSIVE chain(id, previous_response_id, size, depth) AS ("
        f" SELECT v.id, v.previous_response_id, v.size, 1 FROM ({subquery}) v WHERE v.id = %s"
        " UNION ALL SELECT v.id, v.previous_response_id, v.size, chain.depth + 1"
        f" FROM ({subquery}) v JOIN chain ON v.id = chain.previous_response_id"
        " WHERE chain.depth < %s"
        ") SELECT id, size FROM chain ORDER BY depth"
    )
    with connections[database].cursor() as cursor:
        cursor.execute(statement, [*params, response_id, *params, most])
        sizes = dict(cursor.fetchall())  # by id, newest first; a cycle (ids that collided) once
    held = sum(sizes.values())
    if held > most_bytes:
        raise APIError(
            f"The conversation {response_id!r} ends is too large to continue: its"
            f" responses hold {held} bytes, above the {most_bytes} left for it. Start a new"
            " one, or send the items it needs as input.",
            param="previous_response_id",
        )
    found = StoredResponse.objects.using(database).in_bulk(list(sizes))
    return [found[each] for each in sizes]


def _items_of(stored: StoredResponse) -> list[dict[str, Any]]:
    output: list[dict[str, Any]] = stored.response.get("output", [])
    return [*stored.input_items, *output]


async def _find(grant: Grant, response_id: str, *columns: str) -> StoredResponse:
    """The stored response ``response_id`` if ``grant`` may see it (else OpenAI's 404),
    only its ``columns`` read."""
    if not _may_exist(response_id):
        raise response_not_found(response_id)
    try:
        found = _visible(grant).filter(pk=response_id).only(*columns)
        stored = await sync_to_async(_first)(found)
    except DatabaseError:
        logger.exception("chatparity: stored responses could not be read")
        raise errors.service_unavailable("Stored responses cannot be read right now.") from None
    if stored is None:
        raise response_not_found(response_id)
    return stored


@reconnecting
def _first(found: QuerySet[StoredResponse]) -> StoredResponse | None:
    return found.first()


# The endpoints of stored responses.


@contextlib.asynccontextmanager
async def _counted(accounting: Accounting) -> AsyncIterator[None]:
    """A read of what the request's key stored, counted against the key's own limits
    (one request, in flight while it lasts): their 429 before anything is read."""
    await accounting.reserve(None, limits.NOTHING)
    try:
        yield
    finally:
        await accounting.settle()


@endpoint("GET", "DELETE")
async def response(call: Call, response_id: str) -> Reply:
    """``GET``: the stored response; ``DELETE``: forget it. Logged, costing nothing."""

    async def read(body: None, accounting: Accounting, grant: Grant) -> Reply:
        async with _counted(accounting):
            if call.method == "GET":
                return json_reply((await _find(grant, response_id, "response")).response)
            stored = await _find(grant, response_id, "id", "size", "api_key")
            await sync_to_async(reconnecting(stored.delete))()
            if stored.api_key_id is not None:
                await limits.count_stored(stored.api_key_id, -stored.size)
        return json_reply({"id": response_id, "object": "response", "deleted": True})

    return await serve(call, read, logged_as=Endpoint.STORED_RESPONSES, body=False)


MAX_PAGE = 100
_LIMIT = Integer(1, MAX_PAGE)
_ORDER = Enum(("asc", "desc"))


@endpoint("GET")
async def input_items(call: Call, response_id: str) -> Reply:
    """The input items of a stored response, a page at a time, as OpenAI lists them."""

    async def read(body: None, accounting: Accounting, grant: Grant) -> Reply:
        query = {name: values[-1] for name, values in parse_qs(call.query).items()}
        limit = _LIMIT.parse(_number(query.get("limit", "20")), "limit")
        order = _ORDER.parse(query.get("order", "desc"), "order")
        async with _counted(accounting):
            stored = await _find(grant, response_id, "input_items")
        items: list[dict[str, Any]] = stored.input_items
        if order == "desc":
            items = items[::-1]
        after = query.get("after")
        if after is not None:
            ids = [item.get("id") for item in items]
            items = items[ids.index(after) + 1 :] if after in ids else []
        page = items[:limit]
        return json_reply(
            {
                "object": "list",
                "data": page,
                "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None,
                "has_more": len(items) > limit,
            }
        )

    return await serve(call, read, logged_as=Endpoint.STORED_RESPONSES, body=False)


def _number(text: str) -> int | str:
    """A query parameter's digits as an integer (else the text, refused as a wrong type)."""
    return int(text) if _DIGITS.fullmatch(text) else text


_DIGITS = re.compile(r"[0-9]{1,9}")  # ASCII: str.isdigit() takes "²", which int() refuses
