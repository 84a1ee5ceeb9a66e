"""What one user's keys used: per day and per alias over a span, and their latest requests."""

from __future__ import annotations

import datetime
from typing import Any

from django.db.models import Count, DecimalField, QuerySet, Sum, Value
from django.db.models.functions import Coalesce, TruncDate

from ..models import RequestLog

# The columns of a request the portal shows: never a body.
REQUEST_COLUMNS = (
    "created_at", "key_prefix", "alias", "endpoint", "status_code", "error_type",
    "prompt_tokens", "completion_tokens", "total_tokens", "cost", "duration_ms",
)  # fmt: skip


def _rows(owner_id: int) -> QuerySet[RequestLog]:
    return RequestLog.objects.filter(api_key__owner_id=owner_id)


def usage(
    owner_id: int, start: datetime.datetime, end: datetime.datetime
) -> dict[str, list[dict[str, Any]]]:
    """Requests, tokens and cost of ``owner_id``'s keys from ``start`` to ``end``: per
    day (UTC), per alias, and in total (one row)."""
    rows = _rows(owner_id).filter(created_at__gte=start, created_at__lt=end).order_by()
    measures = {
        "requests": Count("pk"),
        "prompt_tokens": Coalesce(Sum("prompt_tokens"), 0),
        "completion_tokens": Coalesce(Sum("completion_tokens"), 0),
        "total_tokens": Coalesce(Sum("total_tokens"), 0),
        "cost": Coalesce(Sum("cost"), Value(0), output_field=DecimalField()),
    }
    by_day = rows.annotate(day=TruncDate("created_at")).values("day").annotate(**measures)
    by_alias = rows.values("alias").annotate(**measures)
    return {
        "by_day": list(by_day.order_by("day")),
        "by_alias": list(by_alias.order_by("alias")),
        "total": [rows.aggregate(**measures)],
    }


def recent_requests(owner_id: int, count: int) -> list[dict[str, Any]]:
    """The latest ``count`` requests of ``owner_id``'s keys, newest first."""
    latest = _rows(owner_id).order_by("-created_at", "-pk")[:count]
    return list(latest.values(*REQUEST_COLUMNS))
