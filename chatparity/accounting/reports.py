"""Usage reports: the one source of the dashboard's charts, the management API's
aggregates and the portal's usage, all read from the daily rollups
(:mod:`.rollups`), never the log: a year costs what a day does, and pruned rows
still count."""

from __future__ import annotations

import datetime
import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from django.db.models import Q, QuerySet, Sum

from ..models import (
    COST_PRECISION,
    HISTOGRAM_KEYS,
    LATENCY_BOUNDS_MS,
    UNBILLED_ENDPOINTS,
    ApiKey,
    DailyAliasUsage,
    DailyDeploymentUsage,
    DailyKeyTotal,
    DailyKeyUsage,
    RequestLog,
    UsageTotals,
)
from .rollups import HISTOGRAMS, day_start

Dimension = Literal["day", "key", "alias", "endpoint"]
DIMENSIONS: tuple[Dimension, ...] = ("day", "key", "alias", "endpoint")

# The columns each dimension groups by (a key's name is added after).
_COLUMNS: dict[Dimension, str] = {
    "day": "day",
    "key": "key_prefix",
    "alias": "alias",
    "endpoint": "endpoint",
}
USAGE_MEASURES = (
    "requests", "errors", "cancelled", "prompt_tokens", "completion_tokens", "total_tokens",
    "cached_tokens", "cache_write_5m_tokens", "cache_write_1h_tokens", "cost",
)  # fmt: skip
CACHE_MEASURES = ("cache_hits", "cache_misses", "cost_saved")


@dataclass(frozen=True)
class LogFilter:
    """Which requests a report covers: a date range (inclusive, UTC days), a key (its
    prefix), an alias (ignoring case), an endpoint (an
    :class:`~chatparity.models.Endpoint` value)."""

    since: datetime.date | None = None
    until: datetime.date | None = None
    key_prefix: str = ""
    alias: str = ""
    endpoint: str = ""

    def apply(self, rows: QuerySet[RequestLog]) -> QuerySet[RequestLog]:
        """The log rows it covers; days as ranges of created_at, which its index serves."""
        if self.since is not None:
            rows = rows.filter(created_at__gte=day_start(self.since))
        if self.until is not None:
            rows = rows.filter(created_at__lt=day_start(self.until + datetime.timedelta(days=1)))
        if self.key_prefix:
            rows = rows.filter(key_prefix=self.key_prefix)
        if self.alias:
            rows = rows.filter(alias__iexact=self.alias)
        if self.endpoint:
            rows = rows.filter(endpoint=self.endpoint)
        return rows

    def rollups(self, per: Sequence[Dimension] = (), *, latency: bool = False) -> QuerySet[Any]:
        """The daily rollups it covers, from the smallest table that holds what is asked:
        ``per`` these dimensions, with the latency histograms if ``latency``."""
        by_key = "key" in per or bool(self.key_prefix)
        by_alias = latency or bool({"alias", "endpoint"} & set(per) or self.alias or self.endpoint)
        if by_key:
            model: type[UsageTotals] = DailyKeyUsage if by_alias else DailyKeyTotal
        else:
            model = DailyAliasUsage
        rows: QuerySet[Any] = model._default_manager.order_by()
        if self.key_prefix:
            rows = rows.filter(key_prefix=self.key_prefix)
        return self.within(rows)

    def within(self, rows: QuerySet[Any]) -> QuerySet[Any]:
        """The rollups of ``rows`` in its days, of its alias and endpoint (not its key)."""
        if self.since is not None:
            rows = rows.filter(day__gte=self.since)
        if self.until is not None:
            rows = rows.filter(day__lte=self.until)
        if self.alias:
            rows = rows.filter(alias__iexact=self.alias)
        if self.endpoint:
            rows = rows.filter(endpoint=self.endpoint)
        return rows


def sums(
    rows: QuerySet[Any],
    columns: Sequence[str],
    measures: Sequence[str],
    *,
    limit: int | None = None,
) -> list[Any]:
    """``measures`` summed over ``rows`` per group of ``columns``, in group order (no
    columns: one row of totals), the first ``limit`` groups if given. Zero, not None,
    where nothing was summed."""
    # An annotation may not take a field's name: sum under another, then rename.
    aggregates = {f"sum_{measure}": Sum(measure) for measure in measures}
    if columns:
        grouped = rows.values(*columns).annotate(**aggregates).order_by(*columns)
        groups = list(grouped if limit is None else grouped[:limit])
    else:
        groups = [rows.aggregate(**aggregates)]
    return [
        {
            **{column: group[column] for column in columns},
            **{measure: group[f"sum_{measure}"] or 0 for measure in measures},
        }
        for group in groups
    ]


def group_position(group: dict[str, Any], dimensions: Sequence[Dimension]) -> list[Any]:
    """Where ``group`` (a :func:`usage` row) stands in the order of ``dimensions``: the
    values of its columns, for :func:`usage`'s ``after``."""
    return [group[_COLUMNS[dimension]] for dimension in dimensions]


def after_position(columns: Sequence[str], position: Sequence[Any]) -> Q:
    """The rows whose ``columns`` come after ``position`` (their values) in that order,
    as a condition on the rows themselves: the database filters before it groups, and
    an index on the columns serves it."""
    *earlier, (last, value) = zip(columns, position, strict=True)
    after = Q(**{f"{last}__gt": value})
    for column, value in reversed(earlier):
        after = Q(**{f"{column}__gt": value}) | Q(**{column: value}) & after
    # Redundant, but a range on the first column that an index can seek to.
    first, value = columns[0], position[0]
    return Q(**{f"{first}__gte": value}) & after


def key_names(prefixes: set[str]) -> dict[str, str]:
    """The names of the keys with these prefixes (joined if several share one); a
    deleted key's prefix is its own name."""
    names: dict[str, list[str]] = {prefix: [] for prefix in prefixes}
    keys = ApiKey.objects.filter(prefix__in=prefixes).order_by("name")
    for prefix, name in keys.values_list("prefix", "name"):
        names[prefix].append(name)
    return {prefix: " / ".join(found) or prefix for prefix, found in names.items()}


def usd(cost: Any) -> Decimal:
    """A summed cost to the rollups' precision (1e-8 USD: SQLite sums in floating point),
    nothing as 0 rather than 0E-8."""
    return Decimal(cost).quantize(COST_PRECISION) if cost else Decimal(0)


def cache_read_share(cached_tokens: int, prompt_tokens: int) -> float | None:
    """The share of the prompt tokens read from the provider's prompt cache (None: no
    prompt)."""
    return cached_tokens / prompt_tokens if prompt_tokens else None


def cache_read_percent(cached_tokens: int, prompt_tokens: int) -> float | None:
    """:func:`cache_read_share` in percent, as pages show it."""
    share = cache_read_share(cached_tokens, prompt_tokens)
    return None if share is None else share * 100


def usage(
    log_filter: LogFilter,
    dimensions: Sequence[Dimension],
    *,
    after: Sequence[Any] | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """Requests, errors, hang-ups, tokens (cache reads and writes among the prompt's) and
    cost (USD, a Decimal) per group of ``dimensions``, in group order; no dimensions:
    one row of totals. A key's group also has its ``key_name``.

    A page of them with ``limit`` (at most that many groups) and ``after`` (the
    :func:`group_position` of the last group of the page before): both go to the
    database, which reads from there along the order, so a page costs the same memory
    wherever it starts and however many groups there are.
    """
    columns = [_COLUMNS[dimension] for dimension in dimensions]
    rollups = log_filter.rollups(dimensions)
    if after is not None:
        rollups = rollups.filter(after_position(columns, after))
    groups = sums(rollups, columns, USAGE_MEASURES, limit=limit)
    for group in groups:
        group["cost"] = usd(group["cost"])
    if "key" in dimensions:
        names = key_names({group["key_prefix"] for group in groups})
        for group in groups:
            group["key_name"] = names[group["key_prefix"]]
    return groups


def usage_by_day_and_alias(
    since: datetime.date,
    until: datetime.date,
    *,
    owner_id: int | None = None,
    key_prefix: str = "",
) -> list[dict[str, Any]]:
    """Per UTC day and alias from ``since`` to ``until`` (inclusive), in that order: the
    requests, errors, tokens (cache reads and writes among them) and cost (USD, a Decimal)
    of the keys ``owner_id`` owned when the requests were logged, or of the key
    ``key_prefix``, or both at once.

    One query of the rollups (indexed by owner and by key): a user's month costs the
    same whatever their traffic, and pruned rows still count.
    """
    rows = LogFilter(since=since, until=until, key_prefix=key_prefix).rollups(["key", "alias"])
    if owner_id is not None:
        rows = rows.filter(owner_id=owner_id)
    groups = sums(rows, ["day", "alias"], (*USAGE_MEASURES, *CACHE_MEASURES))
    for group in groups:
        group["cost"] = usd(group["cost"])
        group["cost_saved"] = usd(group["cost_saved"])
    return groups


def cache_by_alias(log_filter: LogFilter) -> list[dict[str, Any]]:
    """Per alias whose response cache was looked up: its hits, misses, the percentage of
    lookups it answered (``hit_percent``) and the cost it saved (USD, a Decimal)."""
    groups = sums(log_filter.rollups(["alias"]), ["alias"], CACHE_MEASURES)
    return [
        {
            **group,
            "cost_saved": Decimal(group["cost_saved"]),
            "hit_percent": group["cache_hits"] / lookups * 100,
        }
        for group in groups
        if (lookups := group["cache_hits"] + group["cache_misses"])
    ]


# How far a percentile may be from the true value, as a share of it.
TOLERANCE = 0.10


def percentile(counts: Sequence[int], fraction: float) -> float | None:
    """The ``fraction`` quantile (nearest rank) of a latency histogram, ``counts`` per
    bucket of LATENCY_BOUNDS_MS; None when empty.

    The true value is somewhere in the bucket the rank falls in: the estimate is placed
    there by rank, but never further than TOLERANCE from either end where the bucket is
    narrow enough (at most 21% wide: all of them above 5 ms), so it is within 10% of the
    true value whatever that is; below 5 ms, within the bucket's one millisecond. Past
    the last bound, the last bound.
    """
    total = sum(counts)
    if not total:
        return None
    rank = max(1, math.ceil(fraction * total))
    below = 0
    for index, count in enumerate(counts):
        if below + count >= rank:
            lower = LATENCY_BOUNDS_MS[index - 1] if index else 0
            if index == len(LATENCY_BOUNDS_MS):
                return float(lower)
            upper = LATENCY_BOUNDS_MS[index]
            # The middle of the rank's share of the bucket, as if its values were even.
            placed = lower + (upper - lower) * (rank - below - 0.5) / count
            least, most = upper / (1 + TOLERANCE), lower * (1 + TOLERANCE)
            return min(max(placed, least), most) if least <= most else placed
        below += count
    raise AssertionError("unreachable: the counts sum to total")


def latency_by_alias(log_filter: LogFilter) -> list[dict[str, Any]]:
    """Per alias: requests, error rate, p50/p95 duration and time to first token (ms) of
    the model's answers (the endpoints that ask it for none are left out: a token count
    is no answer)."""
    rollups = log_filter.rollups(["alias"], latency=True).exclude(endpoint__in=UNBILLED_ENDPOINTS)
    groups = sums(rollups, ["alias"], ("requests", "errors"))
    histograms = histograms_per(rollups, ["alias"])
    return [
        _latency(group, *histograms[(group["alias"],)]) for group in groups if group["requests"]
    ]


def latency_by_deployment(log_filter: LogFilter) -> list[dict[str, Any]]:
    """Per alias and deployment that served its requests: requests, error rate, p50/p95
    duration and time to first token (ms), of every key (a filter's key is not asked)."""
    rollups = DailyDeploymentUsage.objects.order_by().exclude(endpoint__in=UNBILLED_ENDPOINTS)
    rows = log_filter.within(rollups)
    per = ["alias", "deployment"]
    groups = sums(rows, per, ("requests", "errors"))
    histograms = histograms_per(rows, per)
    return [
        {
            **_latency(group, *histograms[(group["alias"], group["deployment"])]),
            "deployment": group["deployment"],
        }
        for group in groups
        if group["requests"]
    ]


def histograms_per(
    rollups: QuerySet[Any], columns: Sequence[str]
) -> dict[tuple[Any, ...], tuple[list[int], list[int]]]:
    """The latency histograms of ``rollups`` summed per values of ``columns``: the
    requests per bucket of LATENCY_BOUNDS_MS (and past it) of duration, then of time to
    first token."""
    summed: dict[tuple[Any, ...], tuple[Counter[str], Counter[str]]] = defaultdict(
        lambda: (Counter(), Counter())
    )
    names = [name for name, _ in HISTOGRAMS]
    for values in rollups.values_list(*columns, *names).iterator():
        for total, histogram in zip(
            summed[values[: len(columns)]], values[len(columns) :], strict=True
        ):
            total.update(histogram)
    return {
        values: (
            [durations[key] for key in HISTOGRAM_KEYS],
            [first_tokens[key] for key in HISTOGRAM_KEYS],
        )
        for values, (durations, first_tokens) in summed.items()
    }


def _latency(
    group: dict[str, Any], durations: list[int], first_tokens: list[int]
) -> dict[str, Any]:
    return {
        "alias": group["alias"],
        "requests": group["requests"],
        "error_rate": group["errors"] / group["requests"],
        "p50_ms": percentile(durations, 0.50),
        "p95_ms": percentile(durations, 0.95),
        "ttft_p50_ms": percentile(first_tokens, 0.50),
        "ttft_p95_ms": percentile(first_tokens, 0.95),
    }
