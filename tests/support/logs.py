"""Request log rows written as the log writer writes them: the row and its day's rollups
in one transaction (``insert_rows``), so that reports, which read the rollups, see them."""

import datetime
import uuid

from chatparity.accounting.inserts import insert_rows
from chatparity.models import RequestLog


def noon(day):
    """Noon UTC of ``day``."""
    return datetime.datetime.combine(day, datetime.time(12), tzinfo=datetime.UTC)


def logged(day=None, *, at=None, **fields):
    """A RequestLog row logged at noon UTC of ``day`` (a date), at ``at`` (a datetime), or
    now; fields not given are those of a plain successful request."""
    row = RequestLog(
        **{
            "request_id": f"req_{uuid.uuid4().hex}",
            "key_prefix": "sk-cp-test",
            "status_code": 200,
            "duration_ms": 100.0,
            **fields,
        }
    )
    row.created_at = at or (noon(day) if day is not None else None)
    insert_rows([row])
    return RequestLog.objects.filter(request_id=row.request_id).latest("pk")


def logged_without_rollups(rows, log=RequestLog):
    """``rows`` (unsaved, each with its created_at) in the log as a version before the
    rollups wrote them: no rollup counts them. ``log``: the rows' model (a migration's)."""
    times = [row.created_at for row in rows]
    for row, created_at in zip(log.objects.bulk_create(rows), times, strict=True):
        log.objects.filter(pk=row.pk).update(created_at=created_at)
