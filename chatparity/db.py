"""Database work done outside Django's request cycle.

The ASGI fast path and the log writer do not go through Django's request
handler, whose ``request_started``/``request_finished`` signals are what
normally replaces a broken connection. Their connections live as long as the
worker's thread (one thread serves every call made through
``sync_to_async``), so they replace a broken one themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import ParamSpec, TypeVar

from django.db import DatabaseError, connection

P = ParamSpec("P")
T = TypeVar("T")


def reconnecting(function: Callable[P, T]) -> Callable[P, T]:
    """Run ``function`` once more on a new connection when the one it used turned
    out broken (the database restarted, a proxy dropped an idle connection)."""

    @wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return function(*args, **kwargs)
        except DatabaseError:
            broken = connection.connection is not None and not connection.is_usable()
            if connection.in_atomic_block or not broken:
                raise
            connection.close()
        return function(*args, **kwargs)

    return wrapper
