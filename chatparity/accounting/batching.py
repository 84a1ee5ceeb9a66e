"""Database work done outside Django's request cycle.

The ASGI fast path and the log writer do not go through Django's request
handler, whose ``request_started``/``request_finished`` signals are what
normally replaces a broken connection. Their connections live as long as the
worker's thread (one thread serves every call made through
``sync_to_async``), so they replace a broken one themselves.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Callable, Coroutine
from functools import wraps
from typing import Any, ParamSpec, TypeVar

from django.db import DatabaseError, connections

P = ParamSpec("P")
T = TypeVar("T")


def reconnecting(function: Callable[P, T]) -> Callable[P, T]:
    """Run ``function`` once more on new connections when one it used turned out
    broken (the database restarted, a proxy dropped an idle connection): whichever
    database the site's routers sent its queries to."""

    @wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return function(*args, **kwargs)
        except DatabaseError:
            broken = [
                connection
                for connection in connections.all(initialized_only=True)
                if connection.connection is not None and not connection.is_usable()
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


class OncePerInterval:
    """A logger's errors, at most one per cause per ``interval`` seconds, each saying
    how often the cause recurred since the last: an outage that fails every request
    is one line per interval in the log, not one per request.

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
        self.logger.error(message, *args, exc_info=exc_info)
