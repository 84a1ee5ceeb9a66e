"""The log: what one request did, written once as a RequestLog row.

Rows are written by one batching writer per event loop, on the database the
site's routers choose for RequestLog.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from asgiref.sync import sync_to_async
from django.db import DatabaseError, OperationalError, connections, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import CharField, Field
from django.utils import timezone

from . import signals, spool
from .conf import app_settings
from .db import OncePerInterval, detached, reconnecting, settle
from .models import ApiKey, Endpoint, ModelAlias, RequestLog
from .protocol.completion import CompletionAccumulator
from .protocol.errors import APIError
from .protocol.events import Usage
from .ratelimit import cost_of
from .signals import send_request_logged

logger = logging.getLogger(__name__)


@dataclass
class UsageRecord:
    """One request's facts, as its :class:`~chatparity.accounting.Accounting` notes them.

    ``key_prefix`` is the key's prefix unless given: a request with no key (an
    admin's trial) names who made it there instead.
    """

    request_id: str
    api_key: ApiKey | None = None
    endpoint: str = Endpoint.CHAT_COMPLETIONS
    key_prefix: str = ""
    client_ip: str | None = None
    user_agent: str = ""
    started: float = field(default_factory=time.perf_counter)
    completion_id: str = ""
    alias: str = ""
    backend: str = ""
    upstream_model: str = ""
    stream: bool = False
    n: int = 1
    status_code: int = 200
    error: APIError | None = None
    cancelled: bool = False
    finish_reasons: dict[int, str] = field(default_factory=dict)
    usage: Usage | None = None
    completion_tokens_sent: int = 0
    first_token_at: float | None = None
    request_body: Any = None
    model_alias: ModelAlias | None = None
    body: CompletionAccumulator | None = field(
        default_factory=lambda: CompletionAccumulator() if app_settings.LOG_BODIES else None
    )
    backend_started: float | None = None
    """When the first backend (of the alias or a fallback) was asked."""
    backend_answered: float | None = None
    """When the backend that serves the request sent its first event."""
    backend_ended: float | None = None
    """When that backend sent its last event, or failed."""
    trace: Any = None
    """The request's spans, when :mod:`chatparity.tracing` traces it."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """The request's headers by lower-case name (a trace's ``traceparent``)."""

    def __post_init__(self) -> None:
        if not self.key_prefix and self.api_key is not None:
            self.key_prefix = self.api_key.prefix

    def backend_seconds(self, now: float) -> float:
        """Seconds the request has waited on backends up to ``now``: from the first
        backend asked (fallbacks included) to the last event of the one that answered,
        or to its first event if it has not ended, or to ``now``."""
        if self.backend_started is None:
            return 0.0
        until = self.backend_ended or self.backend_answered or now
        return until - self.backend_started

    @property
    def tokens(self) -> Usage:
        """The usage the backend reported, else the completion tokens counted as sent."""
        return self.usage or Usage(
            prompt_tokens=0, completion_tokens=self.completion_tokens_sent, counted=True
        )

    def row(self) -> RequestLog:
        usage = self.tokens
        now = time.perf_counter()
        first = self.first_token_at
        generating = now - first if first is not None else 0.0
        log_bodies = app_settings.LOG_BODIES
        row = RequestLog(
            endpoint=self.endpoint,
            completion_id=self.completion_id,
            request_id=self.request_id,
            api_key=self.api_key,
            key_prefix=self.key_prefix,
            alias=self.alias,
            backend=self.backend,
            upstream_model=self.upstream_model,
            stream=self.stream,
            n=self.n,
            status_code=self.status_code,
            error_type=self.error.type if self.error else "",
            error_code=(self.error.code or "") if self.error else "",
            cancelled=self.cancelled,
            finish_reasons=[self.finish_reasons[index] for index in sorted(self.finish_reasons)],
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            total_tokens=usage.total_tokens,
            cached_tokens=usage.cached_tokens,
            reasoning_tokens=usage.reasoning_tokens,
            usage_counted=usage.counted,
            time_to_first_token_ms=None if first is None else (first - self.started) * 1000,
            duration_ms=(now - self.started) * 1000,
            cost=cost_of(self.model_alias, usage.prompt_tokens, usage.completion_tokens)
            if self.model_alias
            else 0,
            output_tokens_per_second=usage.completion_tokens / generating
            if generating > 0
            else None,
            client_ip=ip_address(self.client_ip),
            user_agent=self.user_agent,
            request_body=storable(self.request_body) if log_bodies else None,
            # The body may be kept for a trace's sake alone (TRACE_CONTENT).
            response_body=orjson.dumps(self.body.completion()).decode()
            if self.body is not None and log_bodies
            else "",
        )
        return fit_columns(row)


def fit_columns(row: RequestLog) -> RequestLog:
    """``row`` with its bounded text columns cut to their length and without NUL
    characters, so PostgreSQL takes it."""
    for name, max_length in _text_columns():
        setattr(row, name, storable(getattr(row, name))[:max_length])
    return row


def storable(value: Any) -> Any:
    """``value`` without NUL characters, which PostgreSQL stores in neither text nor
    JSON: a client may send them (in a model name, a user agent, a message)."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, list):
        return [storable(item) for item in value]
    if isinstance(value, dict):
        return {storable(key): storable(item) for key, item in value.items()}
    return value


@functools.cache
def _text_columns() -> list[tuple[str, int]]:
    """The log's bounded text columns: a client's strings end up in several (the model
    it named, its user agent, an error code an upstream sent), and PostgreSQL refuses
    a row with a value longer than its column, which SQLite takes."""
    return [
        (field.attname, field.max_length)
        for field in RequestLog._meta.concrete_fields
        if isinstance(field, CharField) and field.max_length is not None
    ]


@functools.lru_cache(maxsize=4096)  # a worker sees the same clients again and again
def ip_address(address: str | None) -> str | None:
    """``address`` if it is an IP address: servers put other things in REMOTE_ADDR (a
    Unix socket's path, a test client's name), which PostgreSQL would refuse."""
    try:
        return str(ipaddress.ip_address(address or ""))
    except ValueError:
        return None


async def log(row: RequestLog) -> None:
    """Write ``row`` through this event loop's batched writer, then send
    :data:`~chatparity.signals.request_logged`.

    A row the database cannot take now (it is away) is spooled on local disk and
    written when the database is back (not announced then). A row the database
    refuses is logged loudly, never raised: the request it records has had its
    answer (and is not announced).
    """
    try:
        written = await _writer().write(row)
    except DatabaseError:
        logger.exception("chatparity: the log row of %s was lost", row.request_id)
        _count_rows("lost", 1)
        return
    except OSError as exc:  # the database is away and the spool cannot be written
        _outage_log.error("chatparity: log rows were lost (%s)", exc, exc_info=exc)
        _count_rows("lost", 1)
        return
    if not written:
        _count_rows("spooled", 1)
        return
    _count_rows("written", 1)
    await send_request_logged(row)


def _count_rows(outcome: str, count: int) -> None:
    for observer in signals.observers:
        observer.log_rows(outcome, count)


# Seconds a batch waits for more rows before it is written: nobody waits for it
# but the request's own task, after its client has the answer.
BATCH_WAIT = 0.005

# A busy database (SQLite's "database is locked" under many writers, a PostgreSQL
# fail-over) gets a few more tries, over about 1.5 s, before a row is spooled.
SAVE_ATTEMPTS = 5

# Seconds between two tries to drain the spool while it holds rows; and between two
# looks, after a batch was written, for rows other processes of the machine spooled
# (or the journals of dead ones).
DRAIN_SECONDS = 2.0
SPOOL_LOOK_SECONDS = 10.0

# During an outage every request fails the same way: one line per cause per interval.
_outage_log = OncePerInterval(logger)


class LogWriter:
    """Writes the log rows of concurrent requests together, in one transaction.

    Each caller waits for its own row, so a row is never dropped: under load the
    batches grow instead. A batch the database cannot take (it is down) is
    spooled, and drained once it answers again. A row the database refuses (bad
    data, not a busy database) fails only its own request's write, not the rest of
    its batch.
    """

    def __init__(self) -> None:
        self._pending: list[tuple[RequestLog, asyncio.Future[bool]]] = []
        self._flushing: asyncio.Task[None] | None = None
        self._draining: asyncio.Task[None] | None = None
        self._next_look = 0.0  # first look at once: a worker starts with the spool

    async def write(self, row: RequestLog) -> bool:
        """Write ``row``: True once written, False once spooled."""
        written: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending.append((row, written))
        if self._flushing is None:
            self._flushing = detached(self._flush())
        # A caller cancelled while it waits leaves its row in the batch, written all
        # the same.
        return await written

    async def _flush(self) -> None:
        try:
            # A moment for the rows of requests finishing about now to join the
            # batch: one database hop and transaction for all of them.
            await asyncio.sleep(BATCH_WAIT)
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    await _insert_with_retries([row for row, _ in batch])
                except OperationalError as exc:  # the database is down or locked
                    await self._spool(batch, exc)
                except DatabaseError:  # a row it refuses: find which
                    await self._one_by_one(batch)
                except Exception as exc:  # a bug: its callers must not wait forever
                    for _, written in batch:
                        settle(written, exc)
                    raise
                else:
                    for _, written in batch:
                        settle(written, True)
                    if time.monotonic() >= self._next_look:
                        self._next_look = time.monotonic() + SPOOL_LOOK_SECONDS
                        self._drain_soon()
        finally:
            self._flushing = None

    async def _spool(
        self, batch: list[tuple[RequestLog, asyncio.Future[bool]]], cause: OperationalError
    ) -> None:
        _outage_log.error(
            "chatparity: the database does not take log rows (%s); they are spooled",
            cause,
            exc_info=cause,
        )
        try:
            await sync_to_async(spool.keep)([row for row, _ in batch])
        except OSError as exc:
            for _, written in batch:
                settle(written, exc)
            return
        for _, written in batch:
            settle(written, False)
        self._drain_soon()

    async def _one_by_one(self, batch: list[tuple[RequestLog, asyncio.Future[bool]]]) -> None:
        for row, written in batch:
            try:
                await _insert_with_retries([row])
            except OperationalError as exc:
                await self._spool([(row, written)], exc)
            except DatabaseError as exc:
                settle(written, exc)
            else:
                settle(written, True)

    def _drain_soon(self) -> None:
        if self._draining is None:
            self._draining = detached(self._drain())

    async def _drain(self) -> None:
        """Recover the journals of dead processes, then write the machine's spooled
        rows, trying again every DRAIN_SECONDS while any remain."""
        try:
            while True:
                try:
                    await sync_to_async(_recover_and_drain)()
                except (DatabaseError, OSError) as exc:
                    _outage_log.error(
                        "chatparity: spooled log rows are not written yet (%s)", exc, exc_info=exc
                    )
                if not await sync_to_async(spool.pending)():
                    return
                await asyncio.sleep(DRAIN_SECONDS)
        finally:
            self._draining = None


def _recover_and_drain() -> None:
    from . import journal  # which imports this module

    journal.recover()
    written = drain_spool()
    if written:
        logger.warning("chatparity: %d spooled log rows written", written)
        _count_rows("drained", written)


drain_spool = reconnecting(spool.drain)


_writers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LogWriter] = (
    weakref.WeakKeyDictionary()
)


def _writer() -> LogWriter:
    """This event loop's writer: its futures and task cannot move between loops."""
    loop = asyncio.get_running_loop()
    writer = _writers.get(loop)
    if writer is None:
        writer = _writers[loop] = LogWriter()
    return writer


async def _insert_with_retries(rows: list[RequestLog]) -> None:
    for attempt in range(SAVE_ATTEMPTS):
        try:
            await sync_to_async(_write)(rows)
            return
        except OperationalError:
            if attempt == SAVE_ATTEMPTS - 1:
                raise
            await asyncio.sleep(0.05 * 2**attempt)


def _write(rows: list[RequestLog]) -> None:
    insert_rows(rows)
    _mark_used(rows)


@reconnecting
def insert_rows(rows: list[RequestLog]) -> None:
    """Insert ``rows`` in one transaction, without reading their ids back, into the
    database the site's routers choose for writing RequestLog.

    Not ``bulk_create``: compiling its query costs twice the insert itself, and a
    log row needs no id back. Each value is still prepared by its model field.
    """
    database = router.db_for_write(RequestLog)
    connection = connections[database]
    fields = _insert_fields()
    values = [
        [field.get_db_prep_save(_value(field, row), connection) for field in fields] for row in rows
    ]
    with transaction.atomic(using=database), connection.cursor() as cursor:
        cursor.executemany(_insert_sql(connection), values)


def _value(field: Field[Any, Any], row: RequestLog) -> Any:
    if field.attname == "created_at" and row.created_at is not None:
        return row.created_at  # a spooled row's: when it was first written
    return field.pre_save(row, True)


@functools.cache
def _insert_fields() -> list[Field[Any, Any]]:
    return [field for field in RequestLog._meta.concrete_fields if not field.primary_key]


_insert_statements: dict[str, str] = {}  # by database vendor


def _insert_sql(connection: BaseDatabaseWrapper) -> str:
    statement = _insert_statements.get(connection.vendor)
    if statement is None:
        quote = connection.ops.quote_name
        columns = ", ".join(quote(field.column) for field in _insert_fields())
        placeholders = ", ".join(["%s"] * len(_insert_fields()))
        table = quote(RequestLog._meta.db_table)
        statement = f"INSERT INTO {table} ({columns}) VALUES ({placeholders})"
        _insert_statements[connection.vendor] = statement
    return statement


# A key's last_used_at is a day-to-day hint in the admin, not a record (the log
# is): each worker stamps a key at most once a minute.
STAMP_SECONDS = 60.0
_stamped: dict[str, float] = {}  # hashed key -> when this worker last stamped it


def _mark_used(rows: list[RequestLog]) -> None:
    """Stamp the keys' ``last_used_at``: a convenience, never worth failing a request."""
    now = time.monotonic()
    due = {}
    for row in rows:
        key = row.api_key
        if key is not None and _stamped.get(key.hashed_key, -STAMP_SECONDS) + STAMP_SECONDS <= now:
            due[key.hashed_key] = key.pk
    if not due:
        return
    try:
        ApiKey.objects.filter(pk__in=due.values()).update(last_used_at=timezone.now())
    except DatabaseError:
        logger.warning("chatparity: could not mark keys %s as used", sorted(map(str, due.values())))
    else:
        _stamped.update(dict.fromkeys(due, now))
