"""Log rows inserted in one statement, and the keys they name stamped as used."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
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
    log row needs no id back. Each value is still prepared by its model field. The rows
    of a batch are created at one moment, that of their insert (as ``auto_now_add``
    would stamp each); a spooled row keeps the moment it was first written.
    """
    database = router.db_for_write(RequestLog)
    connection = connections[database]
    now = timezone.now()
    for row in rows:
        if row.created_at is None:
            row.created_at = now
    columns = _insert_columns()
    values = [
        [prepare(getattr(row, name), connection) for name, prepare in columns] for row in rows
    ]
    with transaction.atomic(using=database):
        with connection.cursor() as cursor:
            cursor.executemany(_insert_sql(connection), values)
        rollups.record(rows, connection)


@functools.cache
def _insert_fields() -> list[Field[Any, Any]]:
    return [field for field in RequestLog._meta.concrete_fields if not field.primary_key]


@functools.cache
def _insert_columns() -> list[tuple[str, Callable[[Any, BaseDatabaseWrapper], Any]]]:
    """Each inserted field's attribute and what prepares its value for the database. A
    field's ``pre_save`` only reads the attribute, but ``created_at``'s (``auto_now_add``),
    which :func:`insert_rows` sets instead."""
    fields = _insert_fields()
    assert all(
        type(field).pre_save is Field.pre_save or field.attname == "created_at" for field in fields
    ), "a field that makes its value as it is saved"
    return [(field.attname, field.get_db_prep_save) for field in fields]


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
