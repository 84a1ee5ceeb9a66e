"""Helpers of the management API tests."""

import datetime

from django.urls import reverse

from chatparity.models import RequestLog


def url(name, *args):
    return reverse(f"chatparity-api:{name}", args=args)


def make_log(day=None, **fields):
    """A RequestLog row; ``day`` (a date) moves its created_at to noon UTC of that day."""
    required = {"request_id": "req", "key_prefix": "sk-cp-test", "status_code": 200}
    row = RequestLog.objects.create(**{**required, "duration_ms": 100.0, **fields})
    if day is not None:
        noon = datetime.datetime.combine(day, datetime.time(12), tzinfo=datetime.UTC)
        RequestLog.objects.filter(pk=row.pk).update(created_at=noon)
        row.refresh_from_db()
    return row
