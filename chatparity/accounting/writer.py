"""The log writer: the rows of concurrent requests written together, one batching
writer per event loop, on the database the site's routers choose for RequestLog;
rows the database cannot take are spooled (:mod:`.spool`) and drained later."""

from __future__ import annotations

import asyncio
import logging
import time

from asgiref.sync import sync_to_async
from django.db import DatabaseError, OperationalError

from .. import signals
from ..models import RequestLog
from ..signals import send_request_logged
from . import inserts, journal, spool
from .batching import BatchWriter, OncePerInterval, PerLoop, detached, reconnecting, settle

logger = logging.getLogger(__name__)


async def log(row: RequestLog) -> None:
    """Write ``row`` through this event loop's batched writer, then send
    :data:`~chatparity.signals.request_logged`.

    A row the database cannot take now (it is away) is spooled on local disk and
    written when the database is back (not announced then). A row the database
    refuses is logged loudly, never raised: the request it records has had its
    answer (and is not announced).
    """
    try:
        written = await _writers.get().write(row)
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


class LogWriter(BatchWriter[RequestLog]):
    """Writes the log rows of concurrent requests together, in one transaction.

    Each caller waits for its own row, so a row is never dropped: under load the
    batches grow instead. Its failure policy is spool-and-retry: a busy database is
    tried again; a batch the database cannot take (it is down) is spooled, and drained
    once it answers again. A row the database refuses (bad data, not a busy database)
    fails only its own request's write, not the rest of its batch.
    """

    wait = BATCH_WAIT

    def __init__(self) -> None:
        super().__init__()
        self._draining: asyncio.Task[None] | None = None
        self._next_look = 0.0  # first look at once: a worker starts with the spool

    async def save(self, rows: list[RequestLog]) -> None:
        await _insert_with_retries(rows)

    async def refused(
        self, batch: list[tuple[RequestLog, asyncio.Future[bool]]], error: DatabaseError
    ) -> None:
        if isinstance(error, OperationalError):  # the database is down or locked
            await self._spool(batch, error)
        else:  # a row it refuses: find which
            await super().refused(batch, error)

    async def row_failed(
        self, row: RequestLog, outcome: asyncio.Future[bool], error: DatabaseError
    ) -> None:
        if isinstance(error, OperationalError):
            await self._spool([(row, outcome)], error)
        else:
            settle(outcome, error)

    def written(self) -> None:
        if time.monotonic() >= self._next_look:
            self._next_look = time.monotonic() + SPOOL_LOOK_SECONDS
            self._drain_soon()

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
            spool.failed("keep", exc)
            for _, written in batch:
                settle(written, exc)
            return
        spool.worked("keep")
        for _, written in batch:
            settle(written, False)
        self._drain_soon()

    def _drain_soon(self) -> None:
        if self._draining is None:
            self._draining = detached(self._drain())

    async def _drain(self) -> None:
        """Recover the journals of dead processes, then write the machine's spooled
        rows, trying again every DRAIN_SECONDS while any remain. It never dies with an
        error no one sees: a spool folder it cannot use is said and counted, and so is
        anything else that would end it (the next look starts another)."""
        try:
            while True:
                if not await sync_to_async(_recover_and_drain)():
                    return
                await asyncio.sleep(DRAIN_SECONDS)
        except Exception as exc:  # a bug: said, counted
            spool.failed("drain", exc)
        finally:
            self._draining = None


def _recover_and_drain() -> bool:
    """One pass of the drain; whether spooled rows remain for another. A part that
    cannot use the spool folder leaves the others to do what they can, and the pass
    says so once (:func:`spool.failed`); a folder that cannot be read ends the
    passes until the next look."""
    failures: list[OSError] = []
    try:
        journal.recover()
    except OSError as exc:
        failures.append(exc)
    try:
        written = drain_spool()
    except DatabaseError as exc:
        _outage_log.error(
            "chatparity: spooled log rows are not written yet (%s)", exc, exc_info=exc
        )
    except OSError as exc:
        failures.append(exc)
    else:
        if written:
            logger.warning("chatparity: %d spooled log rows written", written)
            _count_rows("drained", written)
    try:
        remaining = spool.pending()
    except OSError as exc:
        failures.append(exc)
        remaining = False
    if failures:
        spool.failed("drain", failures[0])
    else:
        spool.worked("drain")
    return remaining


drain_spool = reconnecting(spool.drain)


_writers = PerLoop(LogWriter)
"""This event loop's writer."""


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
    inserts.insert_rows(rows)
    inserts.mark_used(rows)
