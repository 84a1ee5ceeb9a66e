"""Usage reports over the request log: the one source of the dashboard's charts
and the management API's aggregates."""

from __future__ import annotations

import datetime
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from django.db.models import Count, F, Q, QuerySet, Sum
from django.db.models.functions import Coalesce, TruncDate

from ..models import RequestLog

Dimension = Literal["day", "key", "alias", "endpoint"]
DIMENSIONS: tuple[Dimension, ...] = ("day", "key", "alias", "endpoint")

# The columns each dimension groups by; ``key`` keeps the prefix of a deleted key.
_COLUMNS: dict[Dimension, tuple[str, ...]] = {
    "day": ("day",),
    "key": ("key_prefix", "key_name"),
    "alias": ("alias",),
    "endpoint": ("endpoint",),
}

FAILED = Q(status_code__gte=400) | ~Q(error_type="")


@dataclass(frozen=True)
class LogFilter:
    """Which log rows a report covers: a date range (inclusive, UTC days), a key, an
    alias, an endpoint (an :class:`~chatparity.models.Endpoint` value)."""

    since: datetime.date | None = None
    until: datetime.date | None = None
    key_prefix: str = ""
    alias: str = ""
    endpoint: str = ""

    def apply(self, rows: QuerySet[RequestLog]) -> QuerySet[RequestLog]:
        if self.since is not None:
            rows = rows.filter(created_at__date__gte=self.since)
        if self.until is not None:
            rows = rows.filter(created_at__date__lte=self.until)
        if self.key_prefix:
            rows = rows.filter(key_prefix=self.key_prefix)
        if self.alias:
            rows = rows.filter(alias__iexact=self.alias)
        if self.endpoint:
            rows = rows.filter(endpoint=self.endpoint)
        return rows


def usage(rows: QuerySet[RequestLog], dimensions: Sequence[Dimension]) -> list[dict[str, Any]]:
    """Requests, errors, hang-ups and tokens per group of ``dimensions``, in group order;
    no dimensions: one row of totals."""
    measures = {
        "requests": Count("pk"),
        "errors": Count("pk", filter=FAILED),
        "cancelled": Count("pk", filter=Q(cancelled=True)),
        "prompt_tokens": Coalesce(Sum("prompt_tokens"), 0),
        "completion_tokens": Coalesce(Sum("completion_tokens"), 0),
        "total_tokens": Coalesce(Sum("total_tokens"), 0),
    }
    if not dimensions:
        return [rows.aggregate(**measures)]
    columns = [column for dimension in dimensions for column in _COLUMNS[dimension]]
    grouped = rows.annotate(
        day=TruncDate("created_at"), key_name=Coalesce("api_key__name", F("key_prefix"))
    )
    totals = grouped.order_by().values(*columns).annotate(**measures).order_by(*columns)
    return list(totals)


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """The ``fraction`` quantile of ``values`` (nearest rank), None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def latency_by_alias(rows: QuerySet[RequestLog]) -> list[dict[str, Any]]:
    """Per alias: requests, error rate, p50/p95 duration and time to first token (ms)."""
    durations: dict[str, list[float]] = defaultdict(list)
    first_tokens: dict[str, list[float]] = defaultdict(list)
    errors: dict[str, int] = defaultdict(int)
    facts: Iterable[tuple[str, float, float | None, bool]] = (
        rows.order_by()
        .annotate(failed=Q(FAILED))
        .values_list("alias", "duration_ms", "time_to_first_token_ms", "failed")
        .iterator(chunk_size=5000)
    )
    for alias, duration, first_token, failed in facts:
        durations[alias].append(duration)
        if first_token is not None:
            first_tokens[alias].append(first_token)
        errors[alias] += bool(failed)
    return [
        {
            "alias": alias,
            "requests": len(durations[alias]),
            "error_rate": errors[alias] / len(durations[alias]),
            "p50_ms": percentile(durations[alias], 0.50),
            "p95_ms": percentile(durations[alias], 0.95),
            "ttft_p50_ms": percentile(first_tokens[alias], 0.50),
            "ttft_p95_ms": percentile(first_tokens[alias], 0.95),
        }
        for alias in sorted(durations)
    ]
