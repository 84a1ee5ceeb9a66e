"""What one user's keys used: per day and per alias over a span, and their latest requests."""

from __future__ import annotations

import datetime
from typing import Any

from ..accounting import reports
from ..models import RequestLog

# What the usage page sums.
MEASURES = (
    "requests", "prompt_tokens", "completion_tokens", "total_tokens", "cached_tokens",
    "cache_write_5m_tokens", "cache_write_1h_tokens", "cost", "cache_hits", "cache_misses",
    "cost_saved",
)  # fmt: skip
# The columns of a request the portal shows: never a body.
REQUEST_COLUMNS = (
    "created_at", "key_prefix", "api_key__name", "alias", "endpoint", "status_code", "error_type",
    "prompt_tokens", "completion_tokens", "total_tokens", "cached_tokens",
    "cache_write_5m_tokens", "cache_write_1h_tokens", "cost", "duration_ms",
)  # fmt: skip


def usage(
    owner_id: int, first: datetime.date, end: datetime.date
) -> dict[str, list[dict[str, Any]]]:
    """Requests, tokens (the prompt's cache reads and writes among them) and cost of
    ``owner_id``'s keys from the UTC day ``first`` up to ``end`` (excluded): per day, per
    alias, and in total (one row), each with its ``cache_read_percent``. From the daily
    rollups (:func:`chatparity.accounting.reports.usage_by_day_and_alias`), so a month
    costs the same however busy it was."""
    last = end - datetime.timedelta(days=1)
    groups = reports.usage_by_day_and_alias(first, last, owner_id=owner_id)
    return {
        "by_day": _totals(groups, "day"),
        "by_alias": _totals(groups, "alias"),
        "total": [_summed(groups)],
    }


def _summed(groups: list[dict[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = dict.fromkeys(MEASURES, 0)
    for group in groups:
        for measure in MEASURES:
            total[measure] += group[measure]
    total["cache_write_tokens"] = total["cache_write_5m_tokens"] + total["cache_write_1h_tokens"]
    total["cache_read_percent"] = reports.cache_read_percent(
        total["cached_tokens"], total["prompt_tokens"]
    )
    return total


def _totals(groups: list[dict[str, Any]], column: str) -> list[dict[str, Any]]:
    """``groups`` summed per value of ``column``, in its order."""
    parts: dict[Any, list[dict[str, Any]]] = {}
    for group in groups:
        parts.setdefault(group[column], []).append(group)
    return [{column: value, **_summed(part)} for value, part in sorted(parts.items())]


def recent_requests(owner_id: int, count: int) -> list[dict[str, Any]]:
    """The latest ``count`` requests of ``owner_id``'s keys, newest first."""
    rows = RequestLog.objects.filter(api_key__owner_id=owner_id)
    latest = rows.order_by("-created_at", "-pk")[:count]
    return list(latest.values(*REQUEST_COLUMNS))


def playground_request(owner_id: int, completion_id: str) -> dict[str, Any] | None:
    """The request ``completion_id`` made with ``owner_id``'s playground keys, once its
    row is written (None before)."""
    rows = RequestLog.objects.filter(
        api_key__owner_id=owner_id, api_key__playground__isnull=False, completion_id=completion_id
    )
    row: dict[str, Any] | None = rows.values(*REQUEST_COLUMNS).first()
    return row
