"""Log rows inserted in one statement, and the keys they name stamped as used."""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

from django.db import DatabaseError, connections, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field
from django.utils import timezone

from ..models import ApiKey, RequestLog
from . import rollups
from .batching import reconnecting

logger = logging.getLogger(__name__)


@reconnecting
def insert_rows(rows: list[RequestLog]) -> None:
    """Insert ``rows`` in one transaction, without reading their ids back, into the
    database the site's routers choose for writing RequestLog, and add them to their
    days' rollups in the same transaction.

    Not ``bulk_create``: compiling its query costs twice the insert itself, and a
    log row needs no id back. Each value is still prepared by its model field.
    """
    database = router.db_for_write(RequestLog)
    connection = connections[database]
    fields = _insert_fields()
    values = [
        [field.get_db_prep_save(_value(field, row), connection) for field in fields] for row in rows
    ]
    with transaction.atomic(using=database):
        with connection.cursor() as cursor:
            cursor.executemany(_insert_sql(connection), values)
        rollups.record(rows, connection)


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


def mark_used(rows: list[RequestLog]) -> None:
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
