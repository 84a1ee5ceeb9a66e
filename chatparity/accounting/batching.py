"""Database work done outside Django's request cycle: rows written in batches.

The ASGI fast path and the batch writers do not go through Django's request
handler, whose ``request_started``/``request_finished`` signals are what
normally replaces a broken connection. Their connections live as long as the
worker's thread (one thread serves every call made through
``sync_to_async``), so they replace a broken one themselves.

:class:`BatchWriter` writes the rows of concurrent requests together (the log rows,
the stored responses), one per event loop (:class:`PerLoop`); an outage is logged
once per interval (:class:`OncePerInterval`).
"""

from __future__ import annotations

import abc
import asyncio
import contextvars
import logging
import time
import weakref
from collections.abc import Callable, Coroutine
from functools import wraps
from typing import Any, Generic, ParamSpec, TypeVar

from django.db import DatabaseError, connections

P = ParamSpec("P")
T = TypeVar("T")
Row = TypeVar("Row")


def reconnecting(function: Callable[P, T]) -> Callable[P, T]:
    """Run ``function`` once more on new connections when one it used turned out
    broken (the database restarted, a proxy dropped an idle connection): whichever
    database the site's routers sent its queries to."""

    @wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        opened = {
            each: each.connection
            for each in connections.all(initialized_only=True)
            if each.connection is not None
        }
        try:
            return function(*args, **kwargs)
        except DatabaseError:
            # Unusable, or replaced already: Django drops a connection whose transaction
            # it could not roll back (bulk_create's, for one) and opens another.
            broken = [
                connection
                for connection in connections.all(initialized_only=True)
                if (connection.connection is not None and not connection.is_usable())
                or (connection in opened and opened[connection] is not connection.connection)
            ]
            if not broken or any(connection.in_atomic_block for connection in broken):
                raise
            for connection in broken:
                connection.close()
        return function(*args, **kwargs)

    return wrapper


def detached(coroutine: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """A task for database work that may outlive the request which starts it.

    It runs in an empty context. Under Django's ASGI handler, a request's
    ``sync_to_async`` calls go to a thread of the request's own, which is shut down
    when the request ends: a task that inherited the request's context would then
    get a new thread, and a new database connection, for every call. In an empty
    context the calls go to asgiref's one shared thread, as on the fast path.
    """
    return asyncio.get_running_loop().create_task(coroutine, context=contextvars.Context())


def settle(waiter: asyncio.Future[T], outcome: T | BaseException) -> None:
    """Give ``waiter`` its ``outcome`` (an exception is raised to it) unless it is done
    already: cancelled with the request that awaited it, the rest of a batch is
    settled all the same."""
    if waiter.done():
        return
    if isinstance(outcome, BaseException):
        waiter.set_exception(outcome)
    else:
        waiter.set_result(outcome)


class PerLoop(Generic[T]):
    """One ``T`` per event loop, made by ``factory`` when a loop first asks for it:
    futures, tasks and connections cannot move between loops. It goes with its loop."""

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._instances: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = (
            weakref.WeakKeyDictionary()
        )

    def get(self) -> T:
        """The running event loop's ``T``."""
        loop = asyncio.get_running_loop()
        instance = self._instances.get(loop)
        if instance is None:
            instance = self._instances[loop] = self._factory()
        return instance


class BatchWriter(abc.ABC, Generic[Row]):
    """Writes the rows of concurrent requests together, one transaction a batch.

    Each caller waits for its own row, and the rows that come while a batch is written
    are the next batch: a busy worker makes one transaction for many, an idle one waits
    no longer than :attr:`wait`. A caller cancelled while it waits leaves its row in the
    batch, written all the same. What a failure means is the subclass's policy; by
    default a batch the database refuses is written row by row, and a row it refuses
    fails its own caller only (:meth:`refused`, :meth:`row_failed`).
    """

    wait = 0.0
    """Seconds a batch waits for more rows before it is written."""

    def __init__(self) -> None:
        self._pending: list[tuple[Row, asyncio.Future[bool]]] = []
        self._flushing: asyncio.Task[None] | None = None

    async def write(self, row: Row) -> bool:
        """Write ``row``: True once written, False once set aside by the policy
        (:meth:`row_failed`); else what stopped it is raised."""
        outcome: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending.append((row, outcome))
        if self._flushing is None:
            self._flushing = detached(self._flush())
        return await outcome

    @abc.abstractmethod
    async def save(self, rows: list[Row]) -> None:
        """Write ``rows`` in one transaction."""

    async def refused(
        self, batch: list[tuple[Row, asyncio.Future[bool]]], error: DatabaseError
    ) -> None:
        """Settle a batch :meth:`save` raised ``error`` for: row by row, so that a row the
        database refuses fails only its own caller."""
        if len(batch) == 1:
            await self.row_failed(*batch[0], error)
            return
        for row, outcome in batch:
            try:
                await self.save([row])
            except DatabaseError as exc:
                await self.row_failed(row, outcome, exc)
            else:
                settle(outcome, True)

    async def row_failed(
        self, row: Row, outcome: asyncio.Future[bool], error: DatabaseError
    ) -> None:
        """Settle a row the database did not take: its caller gets ``error``."""
        settle(outcome, error)

    def written(self) -> None:
        """Called after each batch the database took whole."""

    async def _flush(self) -> None:
        try:
            if self.wait:
                # A moment for the rows of requests finishing about now to join the
                # batch: one database hop and transaction for all of them.
                await asyncio.sleep(self.wait)
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    try:
                        await self.save([row for row, _ in batch])
                    except DatabaseError as exc:
                        await self.refused(batch, exc)
                    else:
                        for _, outcome in batch:
                            settle(outcome, True)
                        self.written()
                except Exception as exc:  # a bug: its callers must not wait forever
                    for _, outcome in batch:
                        settle(outcome, exc)
                    raise
        finally:
            self._flushing = None


class OncePerInterval:
    """A logger's errors and warnings, at most one per cause per ``interval`` seconds,
    each saying how often the cause recurred since the last: an outage that fails every
    request is one line per interval in the log, not one per request.

    A cause is the message (its template) and the exception's class.
    """

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.interval = interval
        self.clock = clock
        self._last: dict[tuple[str, type[BaseException] | None], tuple[float, int]] = {}

    def error(self, message: str, *args: object, exc_info: BaseException | None = None) -> None:
        self.log(logging.ERROR, message, *args, exc_info=exc_info)

    def warning(self, message: str, *args: object, exc_info: BaseException | None = None) -> None:
        self.log(logging.WARNING, message, *args, exc_info=exc_info)

    def log(
        self, level: int, message: str, *args: object, exc_info: BaseException | None = None
    ) -> None:
        cause = (message, type(exc_info) if exc_info is not None else None)
        now = self.clock()
        last = self._last.get(cause)
        if last is not None and now - last[0] < self.interval:
            self._last[cause] = (last[0], last[1] + 1)
            return
        self._last[cause] = (now, 0)
        if last is not None and last[1]:
            message += " (%d more like it since the last report)"
            args = (*args, last[1])
        self.logger.log(level, message, *args, exc_info=exc_info)
